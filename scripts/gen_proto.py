#!/usr/bin/env python3
"""Generate the Python gRPC/protobuf modules from proto/*.proto.

    python scripts/gen_proto.py           # (re)write python/quorumstore/proto/
    python scripts/gen_proto.py --check   # exit 1 if the committed files are stale

For every proto/NAME.proto, grpc_tools.protoc writes NAME_pb2.py, NAME_pb2.pyi and,
if it declares a service, NAME_pb2_grpc.py into python/quorumstore/proto/. protoc
emits top-level imports between generated modules (``import oxia_client_pb2 as
...``), which only work when the output directory is on sys.path; they are rewritten
into package-relative imports (``from . import oxia_client_pb2 as ...``) so that
``quorumstore.proto`` works installed. The output depends on the grpcio-tools
version: regenerate (and commit) with the version the project pins.
"""

from __future__ import annotations

import argparse
import difflib
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROTO_DIR = ROOT / "proto"
OUT_DIR = ROOT / "python" / "quorumstore" / "proto"
GENERATED_SUFFIXES = ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py")


def proto_files() -> list[Path]:
    files = sorted(PROTO_DIR.glob("*.proto"))
    if not files:
        raise SystemExit(f"no .proto files in {PROTO_DIR}")
    return files


def is_generated(path: Path) -> bool:
    return path.is_file() and path.name.endswith(GENERATED_SUFFIXES)


def _relativize_imports(text: str, modules: set[str]) -> str:
    """`import X_pb2 [as Y]` -> `from . import X_pb2 [as Y]` for our own modules."""

    def fix(match: re.Match[str]) -> str:
        module, alias = match.group(1), match.group(2) or ""
        if module not in modules:
            return match.group(0)
        return f"from . import {module}{alias}"

    return re.sub(r"^import (\w+)((?: as \w+)?)$", fix, text, flags=re.MULTILINE)


def generate(out_dir: Path) -> list[Path]:
    """Run protoc over proto/*.proto into `out_dir`; return the files written."""
    protos = proto_files()
    out_dir.mkdir(parents=True, exist_ok=True)
    cmd = [
        sys.executable,
        "-m",
        "grpc_tools.protoc",
        f"--proto_path={PROTO_DIR}",
        f"--python_out={out_dir}",
        f"--pyi_out={out_dir}",
        f"--grpc_python_out={out_dir}",
        *(p.name for p in protos),
    ]
    result = subprocess.run(cmd, check=False, cwd=PROTO_DIR, capture_output=True, text=True)
    if result.returncode != 0:
        sys.stderr.write(result.stdout + result.stderr)
        raise SystemExit(f"protoc failed (exit {result.returncode})")

    modules = {f"{p.stem}_pb2" for p in protos} | {f"{p.stem}_pb2_grpc" for p in protos}
    for proto in protos:
        if not re.search(r"^service\s", proto.read_text(encoding="utf-8"), re.MULTILINE):
            # protoc's gRPC plugin writes a module of nothing but a version check.
            (out_dir / f"{proto.stem}_pb2_grpc.py").unlink()
    written = sorted(p for p in out_dir.iterdir() if is_generated(p))
    for path in written:
        text = path.read_text(encoding="utf-8")
        fixed = _relativize_imports(text, modules)
        if fixed != text:
            path.write_text(fixed, encoding="utf-8")
    return written


def check() -> int:
    """Regenerate into a temp dir and compare with OUT_DIR. 0 if equal, else 1."""
    with tempfile.TemporaryDirectory(prefix="gen_proto_") as tmp:
        fresh = {p.name: p.read_bytes() for p in generate(Path(tmp))}
    committed = (
        {p.name: p.read_bytes() for p in OUT_DIR.iterdir() if is_generated(p)}
        if OUT_DIR.is_dir()
        else {}
    )
    problems: list[str] = []
    for name in sorted(fresh.keys() - committed.keys()):
        problems.append(f"missing: {name}")
    for name in sorted(committed.keys() - fresh.keys()):
        problems.append(f"stale (no .proto generates it): {name}")
    for name in sorted(fresh.keys() & committed.keys()):
        if fresh[name] != committed[name]:
            diff = difflib.unified_diff(
                committed[name].decode("utf-8", "replace").splitlines(),
                fresh[name].decode("utf-8", "replace").splitlines(),
                f"committed/{name}",
                f"generated/{name}",
                lineterm="",
                n=1,
            )
            lines = list(diff)
            shown = "\n".join(lines[:40]) + ("\n  ..." if len(lines) > 40 else "")
            problems.append(f"differs: {name}\n{shown}")
    if problems:
        rel = OUT_DIR.relative_to(ROOT)
        print(f"{rel} is out of date with proto/*.proto:", file=sys.stderr)
        for problem in problems:
            print(f"  {problem}", file=sys.stderr)
        print("run: python scripts/gen_proto.py", file=sys.stderr)
        return 1
    print(f"{OUT_DIR.relative_to(ROOT)} is up to date ({len(fresh)} files)")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--check",
        action="store_true",
        help="regenerate into a temp dir; exit 1 if the committed files differ",
    )
    args = parser.parse_args(argv)
    if args.check:
        return check()
    # Generate aside first, so a failing protoc leaves the committed files alone.
    with tempfile.TemporaryDirectory(prefix="gen_proto_") as tmp:
        fresh = {p.name: p.read_bytes() for p in generate(Path(tmp))}
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    for old in OUT_DIR.iterdir():
        if is_generated(old) and old.name not in fresh:
            old.unlink()
            print(f"removed {old.relative_to(ROOT)}")
    for name, data in sorted(fresh.items()):
        target = OUT_DIR / name
        if not target.is_file() or target.read_bytes() != data:
            target.write_bytes(data)
        print(target.relative_to(ROOT))
    return 0


if __name__ == "__main__":
    sys.exit(main())
