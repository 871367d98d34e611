"""quorumstore.client.retry: which failures are retried, and the backoff between tries."""

from __future__ import annotations

import grpc
import pytest

from quorumstore.client.errors import (
    InvalidRequest,
    NamespaceNotFound,
    NotSupported,
    PermissionDenied,
    QuorumStoreError,
    Unauthenticated,
)
from quorumstore.client.retry import Backoff, Transient, classify


def rpc_error(
    code: grpc.StatusCode, details: str, trailing: tuple[tuple[str, str], ...] = ()
) -> grpc.aio.AioRpcError:
    return grpc.aio.AioRpcError(
        code, grpc.aio.Metadata(), grpc.aio.Metadata(*trailing), details=details
    )


def test_unavailable_and_deadline_exceeded_are_transient() -> None:
    for code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
        failure = classify(rpc_error(code, "connection refused"))
        assert failure == Transient(f"{code.name}: connection refused", None)


def test_not_leader_is_transient_and_carries_the_leader_hint() -> None:
    # grpcio reports Oxia's status 106 as UNKNOWN; the message tells it apart.
    error = rpc_error(
        grpc.StatusCode.UNKNOWN,
        "node is not leader for shard 2; leader hint: 127.0.0.1:7002",
        (("leader-hint", "127.0.0.1:7002"),),
    )
    assert classify(error) == Transient(error.details(), "127.0.0.1:7002")
    no_hint = classify(rpc_error(grpc.StatusCode.UNKNOWN, "node is not leader for shard 2"))
    assert isinstance(no_hint, Transient) and no_hint.leader_hint is None


def test_the_data_services_failed_precondition_is_transient_with_its_hint() -> None:
    error = rpc_error(
        grpc.StatusCode.FAILED_PRECONDITION,
        "node is not leader for shard default/0",
        (("leader-hint", "n:2"),),
    )
    assert classify(error) == Transient(error.details(), "n:2")


@pytest.mark.parametrize(
    "code, details, kind",
    [
        (grpc.StatusCode.INVALID_ARGUMENT, "puts[0].key is empty", InvalidRequest),
        (grpc.StatusCode.UNIMPLEMENTED, "no", NotSupported),
        (grpc.StatusCode.UNKNOWN, "oxia: namespace not found: 'x'", NamespaceNotFound),
        (grpc.StatusCode.UNKNOWN, "Unexpected <class 'ZeroDivisionError'>", QuorumStoreError),
        (grpc.StatusCode.PERMISSION_DENIED, "no", PermissionDenied),
        (grpc.StatusCode.UNAUTHENTICATED, "the token has expired", Unauthenticated),
        (grpc.StatusCode.DATA_LOSS, "no", QuorumStoreError),
    ],
)
def test_other_failures_are_final_typed_errors_quoting_the_server(
    code: grpc.StatusCode, details: str, kind: type[QuorumStoreError]
) -> None:
    failure = classify(rpc_error(code, details))
    assert type(failure) is kind
    assert details in str(failure)


def test_backoff_doubles_its_bound_up_to_the_maximum_with_jitter_below_it() -> None:
    backoff = Backoff(initial_s=0.01, max_s=0.05)
    bounds = []
    for _ in range(5):
        bound = backoff.limit
        delay = backoff.next_delay()
        assert bound / 2 <= delay <= bound
        bounds.append(bound)
    assert bounds == [0.01, 0.02, 0.04, 0.05, 0.05]
