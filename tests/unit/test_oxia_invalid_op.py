"""An op the apply could not apply (INVALID_OP, which Oxia's Status lacks) makes the
Oxia write answer INVALID_ARGUMENT, naming the op (issue 49)."""

from __future__ import annotations

import grpc
import pytest

from quorumstore.node.oxia.errors import RequestError
from quorumstore.node.oxia.writes import write_response
from quorumstore.proto import oxia_client_pb2 as pb
from quorumstore.storage.records import Record
from quorumstore.storage.results import INVALID_OP, OK, EntryResult, OpResult, Status


def _request() -> pb.WriteRequest:
    return pb.WriteRequest(
        puts=[pb.PutRequest(key="/a", value=b"1")],
        deletes=[pb.DeleteRequest(key="/b"), pb.DeleteRequest(key="/c")],
    )


def test_an_invalid_op_answers_invalid_argument_naming_it() -> None:
    put = OpResult(Status.OK, Record(b"1", 0, 0, 1, 1))
    with pytest.raises(RequestError) as caught:
        write_response(_request(), EntryResult(7, [put, OK, INVALID_OP]))
    assert caught.value.code is grpc.StatusCode.INVALID_ARGUMENT
    assert "deletes[1] could not be applied" in str(caught.value)
    assert len(write_response(_request(), EntryResult(7, [put, OK, OK])).deletes) == 2


def test_an_entry_that_could_not_be_applied_answers_invalid_argument() -> None:
    result = EntryResult(7, [], invalid="entry 7: write batch is not an Arrow IPC stream")
    with pytest.raises(RequestError) as caught:
        write_response(_request(), result)
    assert caught.value.code is grpc.StatusCode.INVALID_ARGUMENT
    assert "not an Arrow IPC stream" in str(caught.value)
