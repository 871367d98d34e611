"""The byte encoding of keys reproduces Oxia's hierarchical order exactly."""

from __future__ import annotations

import functools

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from quorumstore.wire.keys import _KERNEL_MIN_KEYS as KERNEL_MIN_KEYS
from quorumstore.wire.keys import (
    USER_KEYS_END,
    USER_KEYS_START,
    compare_keys,
    decode_key,
    decode_keys,
    encode_key,
    encode_key_list,
    encode_keys,
    key_range,
)

# Heavy in separators, NULs (escaped), bytes next to the escape/terminator values, and
# multi-byte UTF-8, so that segment boundaries and escapes collide often.
ALPHABET = ["/", "/", "/", "a", "b", "\x00", "\x01", "\x02", "\x7f", "é", "\uffff", "\U0001f600"]
keys_st = st.text(alphabet=st.sampled_from(ALPHABET), max_size=10)


def sign(x: int) -> int:
    return (x > 0) - (x < 0)


def bytewise(a: bytes, b: bytes) -> int:
    return (a > b) - (a < b)


# Expected results from Oxia's own CompareWithSlash test dataset, plus a few more.
OXIA_CASES = [
    ("aaa", "aaa", 0),
    ("aaa", "zzzzz", -1),
    ("bbbbb", "aaaaa", 1),
    ("aaaaa", "", 1),
    ("", "aaaaaa", -1),
    ("", "", 0),
    ("aaaaa", "aaaaaaaaaaa", -1),
    ("aaaaaaaaaaa", "aaa", 1),
    ("a", "/", -1),
    ("/", "a", 1),
    ("/aaaa", "/bbbbb", -1),
    ("/aaaa", "/aa/a", -1),
    ("/aaaa/a", "/aaaa/b", -1),
    ("/aaaa/a/a", "/bbbbbbbbbb", 1),
    ("/aaaa/a/a", "/aaaa/bbbbbbbbbb", 1),
    ("/a/b/a/a/a", "/a/b/a/b", 1),
    ("aaa", "/aaa", -1),
    ("aaa/bbb", "bbb/bbb", -1),
    ("aaa/bbb", "aaa/bbbb", -1),
    ("b", "a/c", -1),
    ("a/z", "a/b/c", -1),
    ("a/", "a/a", -1),
    ("a", "a/", -1),
]


@pytest.mark.parametrize("a,b,expected", OXIA_CASES)
def test_compare_keys_matches_oxia(a: str, b: str, expected: int) -> None:
    assert compare_keys(a, b) == expected
    assert compare_keys(b, a) == -expected
    assert bytewise(encode_key(a), encode_key(b)) == expected


@settings(max_examples=3000, deadline=None)
@given(keys_st, keys_st)
def test_encoding_preserves_order(a: str, b: str) -> None:
    assert bytewise(encode_key(a), encode_key(b)) == sign(compare_keys(a, b))


@settings(max_examples=1000, deadline=None)
@given(keys_st)
def test_round_trip_and_user_key_space(key: str) -> None:
    encoded = encode_key(key)
    assert decode_key(encoded) == key
    assert USER_KEYS_START <= encoded < USER_KEYS_END


@settings(max_examples=300, deadline=None)
@given(st.lists(keys_st, max_size=40))
def test_sorting_by_encoding_is_hierarchical_sorting(keys: list[str]) -> None:
    by_encoding = sorted(keys, key=encode_key)
    by_reference = sorted(keys, key=functools.cmp_to_key(compare_keys))
    assert by_encoding == by_reference


@settings(max_examples=300, deadline=None)
@given(st.lists(keys_st, max_size=40), st.booleans())
def test_vectorised_encoding_matches_scalar(keys: list[str], kernels: bool) -> None:
    if kernels:  # long enough for the kernel path, not the short-array loop
        keys = keys * (KERNEL_MIN_KEYS // max(len(keys), 1) + 1)
    encoded = encode_keys(pa.array(keys, pa.string()))
    assert encoded.type == pa.binary()
    assert encoded.to_pylist() == [encode_key(k) for k in keys]
    assert decode_keys(encoded).to_pylist() == keys


@pytest.mark.parametrize(
    "keys",
    [
        ["a", "bc", ""],  # no pattern: no replacement at all
        ["a/b", "/c", "d/"],  # the last level only
        ["a\x00", "\x00\x00b"],  # escaped NULs only
        ["a/b/c", "x/\x00/y\x02/\x01"],  # every pattern, and the bytes they end with
        ["\x02\x01", "a\x02/b"],  # a pattern's last byte without the pattern
    ],
)
def test_decoding_makes_only_the_replacements_the_keys_need(keys: list[str]) -> None:
    many = keys * KERNEL_MIN_KEYS
    encoded = encode_keys(pa.array(many, pa.string()))
    assert decode_keys(encoded).to_pylist() == many
    assert decode_keys(encoded.slice(1, len(keys))).to_pylist() == many[1 : len(keys) + 1]


@settings(max_examples=20, deadline=None)
@given(st.lists(keys_st, min_size=600, max_size=700) | st.lists(keys_st, max_size=20))
def test_key_list_encoding_matches_scalar_on_both_paths(keys: list[str]) -> None:
    assert encode_key_list(pa.array(keys, pa.string())) == [encode_key(k) for k in keys]


@pytest.mark.parametrize("copies", [1, KERNEL_MIN_KEYS])
def test_vectorised_encoding_keeps_nulls_and_slices(copies: int) -> None:
    keys = pa.array(["x/y", None, "a", "/b/"] * copies, pa.string())
    expected = [encode_key("x/y"), None, encode_key("a"), encode_key("/b/")] * copies
    assert encode_keys(keys).to_pylist() == expected
    assert encode_keys(keys.slice(2)).to_pylist() == expected[2:]
    # A slice that starts after a null and ends before the array does.
    assert encode_keys(keys.slice(2, len(keys) - 3)).to_pylist() == expected[2:-1]


def test_encoding_layout() -> None:
    assert encode_key("") == b"\x01"
    assert encode_key("a") == b"\x01a"
    assert encode_key("a/b") == b"\x02a\x00\x01\x01b"
    assert encode_key("a/b/c") == b"\x02a\x00\x01\x02b\x00\x01\x01c"
    assert encode_key("a\x00/\x00") == b"\x02a\x00\xff\x00\x01\x01\x00\xff"


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"\x00applied",
        b"\x03",
        b"\x01a/b",  # raw separator
        b"\x01a\x00",  # unescaped NUL
        b"\x01a\x00\x01\x01b",  # a level marker after the last-segment tag
        b"\x02ab",  # more levels announced, none follow
        b"\x02a\x00\x01\x01b\x00\x01\x01c",  # two last-level markers
        b"\x02a\x00\x01\x03b",  # unknown level tag
        b"\x01\xff",  # not UTF-8
    ],
)
def test_decode_rejects_foreign_bytes(data: bytes) -> None:
    with pytest.raises(ValueError):
        decode_key(data)


def test_key_range() -> None:
    assert key_range("a", "b") == (encode_key("a"), encode_key("b"))
    assert key_range("", "") == (USER_KEYS_START, USER_KEYS_END)
    assert key_range("a/b", "") == (encode_key("a/b"), USER_KEYS_END)
