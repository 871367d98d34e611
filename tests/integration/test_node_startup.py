"""A started node must not pay one-time costs on its first write.

pyarrow imports pandas on its first `pa.array` call. On a node that import ran at the
first write and stalled the event loop 0.5-0.65 s with three nodes on two cores, long
enough for the coordinator to miss the leader's health reports and elect again (seen in
the process tests as a term change with no fault). The check runs in a fresh interpreter:
this test process has imported pandas already.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

_PROBE = textwrap.dedent(
    """
    import asyncio, sys
    from pathlib import Path
    import pyarrow as pa
    from quorumstore.node.node import Node, NodeConfig

    async def main() -> None:
        node = Node(NodeConfig(Path(sys.argv[1]), port=0, wal_sync=False))
        await node.start()
        before = set(sys.modules)
        pa.array([b"key"], pa.binary())
        print(" ".join(sorted(set(sys.modules) - before)))
        await node.stop()

    asyncio.run(main())
    """
)


def test_first_arrow_array_after_start_imports_nothing(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-c", _PROBE, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    lazily_imported = result.stdout.split()
    assert not lazily_imported, (
        f"{len(lazily_imported)} modules imported at the first write, among them {lazily_imported[:5]}"
    )
