"""`plain_puts` reads a request's puts as columns: checked against asking each put."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from quorumstore.node.oxia.plain_puts import plain_puts
from quorumstore.proto import oxia_client_pb2 as pb

_KEY_AND_VALUE = {pb.PutRequest.KEY_FIELD_NUMBER, pb.PutRequest.VALUE_FIELD_NUMBER}

# Sizes around every varint boundary a key, a value or a whole put can cross.
_SIZES = st.sampled_from(
    [0, 1, 5, 100, 121, 122, 123, 126, 127, 128, 129, 16_250, 16_383, 16_384, 16_400]
)
_KEYS = st.one_of(
    st.text(max_size=40), _SIZES.map(lambda n: "k" * n), _SIZES.map(lambda n: "é" * (n // 2))
)
_VALUES = st.one_of(st.binary(max_size=40), _SIZES.map(lambda n: b"v" * n))


@st.composite
def _puts(draw: st.DrawFn) -> pb.PutRequest:
    put = pb.PutRequest(key=draw(_KEYS), value=draw(_VALUES))
    # Each optional field, set (often to its zero value, which is still encoded) or not.
    if draw(st.booleans()):
        put.expected_version_id = draw(st.sampled_from([0, -1, 7, 1 << 40]))
    if draw(st.booleans()):
        put.session_id = draw(st.sampled_from([0, 3]))
    if draw(st.booleans()):
        put.client_identity = draw(st.sampled_from(["", "me"]))
    if draw(st.booleans()):
        put.partition_key = draw(st.sampled_from(["", "p"]))
    if draw(st.booleans()):
        put.sequence_key_delta.extend(draw(st.lists(st.integers(0, 5), min_size=1, max_size=2)))
    if draw(st.booleans()):
        put.secondary_indexes.add(index_name="i", secondary_key=draw(st.sampled_from(["", "s"])))
    return put


_PLAIN_PUTS = st.builds(lambda key, value: pb.PutRequest(key=key, value=value), _KEYS, _VALUES)


def _plain_by_fields(request: pb.WriteRequest) -> bool:
    return not (request.deletes or request.delete_ranges) and all(
        {field.number for field, _ in put.ListFields()} <= _KEY_AND_VALUE for put in request.puts
    )


@settings(max_examples=800, deadline=None)
@given(
    puts=st.lists(st.one_of(_puts(), _PLAIN_PUTS), max_size=6),
    shard=st.one_of(st.none(), st.sampled_from([0, 5, 1 << 33, -1])),
    deletes=st.booleans(),
)
def test_matches_asking_each_put_for_its_fields(
    puts: list[pb.PutRequest], shard: int | None, deletes: bool
) -> None:
    request = pb.WriteRequest(puts=puts)
    if shard is not None:
        request.shard = shard
    if deletes:
        request.deletes.add(key="gone")
    plain = plain_puts(request)
    assert (plain is not None) == _plain_by_fields(request)
    if plain is not None:
        assert plain.keys.to_pylist() == [put.key for put in puts]
        assert plain.values.to_pylist() == [put.value for put in puts]
        key_bytes = [len(put.key.encode()) for put in puts] or [0]
        assert (plain.shortest_key_bytes, plain.longest_key_bytes) == (
            min(key_bytes),
            max(key_bytes),
        )
        assert plain.largest_value_bytes == max([len(put.value) for put in puts] or [0])


def test_a_field_unknown_to_this_version_makes_a_put_not_plain() -> None:
    put = pb.PutRequest(key="k", value=b"v")
    # Field 99, varint 1: what a newer client's extra field would look like on the wire.
    request = pb.WriteRequest.FromString(
        pb.WriteRequest(puts=[put]).SerializeToString()[:1]
        + bytes([len(put.SerializeToString()) + 3])
        + put.SerializeToString()
        + b"\x98\x06\x01"
    )
    assert request.puts[0].key == "k"
    assert plain_puts(request) is None


@pytest.mark.parametrize("ranges", [False, True])
def test_requests_with_deletes_or_ranges_are_not_plain(ranges: bool) -> None:
    request = pb.WriteRequest(puts=[pb.PutRequest(key="k", value=b"v")])
    if ranges:
        request.delete_ranges.add(start_inclusive="a", end_exclusive="b")
    else:
        request.deletes.add(key="k")
    assert plain_puts(request) is None


def test_an_empty_request_is_plain_and_empty() -> None:
    plain = plain_puts(pb.WriteRequest(shard=2))
    assert plain is not None and len(plain.keys) == 0 and plain.longest_key_bytes == 0


def test_a_field_repeated_on_the_wire_counts_once() -> None:
    # Put 0 names its key twice (protobuf keeps the last), put 1 none: read from the
    # request's own bytes, the key column would pair "a" with put 0 and "b" with put 1.
    put_0 = b"\x0a\x01a" + b"\x0a\x01b" + b"\x12\x01x"
    put_1 = b"\x12\x01y"
    request = pb.WriteRequest.FromString(
        b"\x12" + bytes([len(put_0)]) + put_0 + b"\x12" + bytes([len(put_1)]) + put_1
    )
    assert [(put.key, put.value) for put in request.puts] == [("b", b"x"), ("", b"y")]
    plain = plain_puts(request)
    assert plain is not None
    assert plain.keys.to_pylist() == ["b", ""] and plain.values.to_pylist() == [b"x", b"y"]
    assert (plain.shortest_key_bytes, plain.longest_key_bytes) == (0, 1)
