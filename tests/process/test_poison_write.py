"""Issue 49's reproduction against a real `quorumstore standalone`: a WriteArrow row
whose key is not UTF-8 is refused with INVALID_ARGUMENT before it is proposed, and
the node goes on serving (before, the entry was committed and then stopped every
replica that applied it, at every restart)."""

from __future__ import annotations

from pathlib import Path

import grpc
import pyarrow as pa
import pytest

from quorumstore.arrow.ipc import ipc_bytes
from quorumstore.client.data_service import DataClient
from quorumstore.proto import quorumstore_data_pb2 as pb
from quorumstore.proto import quorumstore_data_pb2_grpc as pb_grpc
from quorumstore.testing import standalone_server

pytestmark = pytest.mark.process


def test_a_key_that_is_not_utf8_is_refused_and_the_node_lives(tmp_path: Path) -> None:
    keys = pa.array([b"fine", b"\xff"], pa.binary()).view(pa.string())
    rows = pa.table({"key": keys, "value": pa.array([b"1", b"2"], pa.binary())})
    with (
        standalone_server(tmp_path / "data", 1, fsync=False) as address,
        DataClient(address, retry_s=10) as client,
        grpc.insecure_channel(client.shard(0).leader) as channel,
    ):
        stub = pb_grpc.QuorumstoreDataStub(channel)
        request = pb.WriteArrowRequest(namespace="default", shard=0, ipc=ipc_bytes(rows))
        with pytest.raises(grpc.RpcError) as caught:
            stub.WriteArrow(request)
        assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "row 1: the key is not valid UTF-8" in caught.value.details()
        assert client.write(0, pa.table({"key": ["fine"], "value": [b"1"]})).offset > 0
        scanned = {
            key: value
            for batch, _ in client.scan(0)
            for key, value in zip(
                batch.column("key").to_pylist(), batch.column("value").to_pylist()
            )
        }
        assert scanned == {"fine": b"1"}
