from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ListShardsRequest(_message.Message):
    __slots__ = ("namespace",)
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    def __init__(self, namespace: _Optional[str] = ...) -> None: ...

class ShardInfo(_message.Message):
    __slots__ = ("shard", "min_hash_inclusive", "max_hash_inclusive", "term", "leader", "followers")
    SHARD_FIELD_NUMBER: _ClassVar[int]
    MIN_HASH_INCLUSIVE_FIELD_NUMBER: _ClassVar[int]
    MAX_HASH_INCLUSIVE_FIELD_NUMBER: _ClassVar[int]
    TERM_FIELD_NUMBER: _ClassVar[int]
    LEADER_FIELD_NUMBER: _ClassVar[int]
    FOLLOWERS_FIELD_NUMBER: _ClassVar[int]
    shard: int
    min_hash_inclusive: int
    max_hash_inclusive: int
    term: int
    leader: str
    followers: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, shard: _Optional[int] = ..., min_hash_inclusive: _Optional[int] = ..., max_hash_inclusive: _Optional[int] = ..., term: _Optional[int] = ..., leader: _Optional[str] = ..., followers: _Optional[_Iterable[str]] = ...) -> None: ...

class ListShardsResponse(_message.Message):
    __slots__ = ("shards",)
    SHARDS_FIELD_NUMBER: _ClassVar[int]
    shards: _containers.RepeatedCompositeFieldContainer[ShardInfo]
    def __init__(self, shards: _Optional[_Iterable[_Union[ShardInfo, _Mapping]]] = ...) -> None: ...

class KeyRange(_message.Message):
    __slots__ = ("min_inclusive", "max_exclusive")
    MIN_INCLUSIVE_FIELD_NUMBER: _ClassVar[int]
    MAX_EXCLUSIVE_FIELD_NUMBER: _ClassVar[int]
    min_inclusive: str
    max_exclusive: str
    def __init__(self, min_inclusive: _Optional[str] = ..., max_exclusive: _Optional[str] = ...) -> None: ...

class SplitRangesRequest(_message.Message):
    __slots__ = ("namespace", "shard", "ranges", "max_rows", "allow_follower")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    SHARD_FIELD_NUMBER: _ClassVar[int]
    RANGES_FIELD_NUMBER: _ClassVar[int]
    MAX_ROWS_FIELD_NUMBER: _ClassVar[int]
    ALLOW_FOLLOWER_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    shard: int
    ranges: _containers.RepeatedCompositeFieldContainer[KeyRange]
    max_rows: int
    allow_follower: bool
    def __init__(self, namespace: _Optional[str] = ..., shard: _Optional[int] = ..., ranges: _Optional[_Iterable[_Union[KeyRange, _Mapping]]] = ..., max_rows: _Optional[int] = ..., allow_follower: _Optional[bool] = ...) -> None: ...

class SplitRangesResponse(_message.Message):
    __slots__ = ("ranges",)
    RANGES_FIELD_NUMBER: _ClassVar[int]
    ranges: _containers.RepeatedCompositeFieldContainer[KeyRange]
    def __init__(self, ranges: _Optional[_Iterable[_Union[KeyRange, _Mapping]]] = ...) -> None: ...

class ScanRequest(_message.Message):
    __slots__ = ("namespace", "shard", "ranges", "keys", "allow_follower", "batch_rows", "secondary_index_name")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    SHARD_FIELD_NUMBER: _ClassVar[int]
    RANGES_FIELD_NUMBER: _ClassVar[int]
    KEYS_FIELD_NUMBER: _ClassVar[int]
    ALLOW_FOLLOWER_FIELD_NUMBER: _ClassVar[int]
    BATCH_ROWS_FIELD_NUMBER: _ClassVar[int]
    SECONDARY_INDEX_NAME_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    shard: int
    ranges: _containers.RepeatedCompositeFieldContainer[KeyRange]
    keys: _containers.RepeatedScalarFieldContainer[str]
    allow_follower: bool
    batch_rows: int
    secondary_index_name: str
    def __init__(self, namespace: _Optional[str] = ..., shard: _Optional[int] = ..., ranges: _Optional[_Iterable[_Union[KeyRange, _Mapping]]] = ..., keys: _Optional[_Iterable[str]] = ..., allow_follower: _Optional[bool] = ..., batch_rows: _Optional[int] = ..., secondary_index_name: _Optional[str] = ...) -> None: ...

class ArrowChunk(_message.Message):
    __slots__ = ("ipc", "commit_offset")
    IPC_FIELD_NUMBER: _ClassVar[int]
    COMMIT_OFFSET_FIELD_NUMBER: _ClassVar[int]
    ipc: bytes
    commit_offset: int
    def __init__(self, ipc: _Optional[bytes] = ..., commit_offset: _Optional[int] = ...) -> None: ...

class StagedPart(_message.Message):
    __slots__ = ("part", "chunks", "rows")
    PART_FIELD_NUMBER: _ClassVar[int]
    CHUNKS_FIELD_NUMBER: _ClassVar[int]
    ROWS_FIELD_NUMBER: _ClassVar[int]
    part: str
    chunks: int
    rows: int
    def __init__(self, part: _Optional[str] = ..., chunks: _Optional[int] = ..., rows: _Optional[int] = ...) -> None: ...

class StagedRows(_message.Message):
    __slots__ = ("write_id", "parts")
    WRITE_ID_FIELD_NUMBER: _ClassVar[int]
    PARTS_FIELD_NUMBER: _ClassVar[int]
    write_id: str
    parts: _containers.RepeatedCompositeFieldContainer[StagedPart]
    def __init__(self, write_id: _Optional[str] = ..., parts: _Optional[_Iterable[_Union[StagedPart, _Mapping]]] = ...) -> None: ...

class WriteArrowRequest(_message.Message):
    __slots__ = ("namespace", "shard", "ipc", "staged", "client_id", "serial", "has_serial", "replace", "replace_min_inclusive", "replace_max_exclusive", "unique_keys", "validate_only")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    SHARD_FIELD_NUMBER: _ClassVar[int]
    IPC_FIELD_NUMBER: _ClassVar[int]
    STAGED_FIELD_NUMBER: _ClassVar[int]
    CLIENT_ID_FIELD_NUMBER: _ClassVar[int]
    SERIAL_FIELD_NUMBER: _ClassVar[int]
    HAS_SERIAL_FIELD_NUMBER: _ClassVar[int]
    REPLACE_FIELD_NUMBER: _ClassVar[int]
    REPLACE_MIN_INCLUSIVE_FIELD_NUMBER: _ClassVar[int]
    REPLACE_MAX_EXCLUSIVE_FIELD_NUMBER: _ClassVar[int]
    UNIQUE_KEYS_FIELD_NUMBER: _ClassVar[int]
    VALIDATE_ONLY_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    shard: int
    ipc: bytes
    staged: StagedRows
    client_id: str
    serial: int
    has_serial: bool
    replace: bool
    replace_min_inclusive: str
    replace_max_exclusive: str
    unique_keys: bool
    validate_only: bool
    def __init__(self, namespace: _Optional[str] = ..., shard: _Optional[int] = ..., ipc: _Optional[bytes] = ..., staged: _Optional[_Union[StagedRows, _Mapping]] = ..., client_id: _Optional[str] = ..., serial: _Optional[int] = ..., has_serial: _Optional[bool] = ..., replace: _Optional[bool] = ..., replace_min_inclusive: _Optional[str] = ..., replace_max_exclusive: _Optional[str] = ..., unique_keys: _Optional[bool] = ..., validate_only: _Optional[bool] = ...) -> None: ...

class WriteArrowResponse(_message.Message):
    __slots__ = ("offset", "duplicate", "rows")
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    DUPLICATE_FIELD_NUMBER: _ClassVar[int]
    ROWS_FIELD_NUMBER: _ClassVar[int]
    offset: int
    duplicate: bool
    rows: int
    def __init__(self, offset: _Optional[int] = ..., duplicate: _Optional[bool] = ..., rows: _Optional[int] = ...) -> None: ...

class StageArrowRequest(_message.Message):
    __slots__ = ("namespace", "shard", "write_id", "part", "chunk", "ipc")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    SHARD_FIELD_NUMBER: _ClassVar[int]
    WRITE_ID_FIELD_NUMBER: _ClassVar[int]
    PART_FIELD_NUMBER: _ClassVar[int]
    CHUNK_FIELD_NUMBER: _ClassVar[int]
    IPC_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    shard: int
    write_id: str
    part: str
    chunk: int
    ipc: bytes
    def __init__(self, namespace: _Optional[str] = ..., shard: _Optional[int] = ..., write_id: _Optional[str] = ..., part: _Optional[str] = ..., chunk: _Optional[int] = ..., ipc: _Optional[bytes] = ...) -> None: ...

class StageArrowResponse(_message.Message):
    __slots__ = ("rows",)
    ROWS_FIELD_NUMBER: _ClassVar[int]
    rows: int
    def __init__(self, rows: _Optional[int] = ...) -> None: ...

class DiscardStagedRequest(_message.Message):
    __slots__ = ("write_id",)
    WRITE_ID_FIELD_NUMBER: _ClassVar[int]
    write_id: str
    def __init__(self, write_id: _Optional[str] = ...) -> None: ...

class DiscardStagedResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GetOffsetsRequest(_message.Message):
    __slots__ = ("namespace", "shard", "allow_follower")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    SHARD_FIELD_NUMBER: _ClassVar[int]
    ALLOW_FOLLOWER_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    shard: int
    allow_follower: bool
    def __init__(self, namespace: _Optional[str] = ..., shard: _Optional[int] = ..., allow_follower: _Optional[bool] = ...) -> None: ...

class GetOffsetsResponse(_message.Message):
    __slots__ = ("commit_offset", "changes_kept_after")
    COMMIT_OFFSET_FIELD_NUMBER: _ClassVar[int]
    CHANGES_KEPT_AFTER_FIELD_NUMBER: _ClassVar[int]
    commit_offset: int
    changes_kept_after: int
    def __init__(self, commit_offset: _Optional[int] = ..., changes_kept_after: _Optional[int] = ...) -> None: ...

class ReadChangesRequest(_message.Message):
    __slots__ = ("namespace", "shard", "start_offset_exclusive", "end_offset_inclusive", "max_rows", "skip_rows")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    SHARD_FIELD_NUMBER: _ClassVar[int]
    START_OFFSET_EXCLUSIVE_FIELD_NUMBER: _ClassVar[int]
    END_OFFSET_INCLUSIVE_FIELD_NUMBER: _ClassVar[int]
    MAX_ROWS_FIELD_NUMBER: _ClassVar[int]
    SKIP_ROWS_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    shard: int
    start_offset_exclusive: int
    end_offset_inclusive: int
    max_rows: int
    skip_rows: int
    def __init__(self, namespace: _Optional[str] = ..., shard: _Optional[int] = ..., start_offset_exclusive: _Optional[int] = ..., end_offset_inclusive: _Optional[int] = ..., max_rows: _Optional[int] = ..., skip_rows: _Optional[int] = ...) -> None: ...
