from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ReplicaRole(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    NOT_MEMBER: _ClassVar[ReplicaRole]
    FENCED: _ClassVar[ReplicaRole]
    FOLLOWER: _ClassVar[ReplicaRole]
    LEADER: _ClassVar[ReplicaRole]

class AckStatus(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    OK: _ClassVar[AckStatus]
    STALE_TERM: _ClassVar[AckStatus]
    GAP: _ClassVar[AckStatus]
    MISMATCH: _ClassVar[AckStatus]

class ShardState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ELECTION: _ClassVar[ShardState]
    ONLINE: _ClassVar[ShardState]
    OFFLINE: _ClassVar[ShardState]
NOT_MEMBER: ReplicaRole
FENCED: ReplicaRole
FOLLOWER: ReplicaRole
LEADER: ReplicaRole
OK: AckStatus
STALE_TERM: AckStatus
GAP: AckStatus
MISMATCH: AckStatus
ELECTION: ShardState
ONLINE: ShardState
OFFLINE: ShardState

class EntryId(_message.Message):
    __slots__ = ("term", "offset")
    TERM_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    term: int
    offset: int
    def __init__(self, term: _Optional[int] = ..., offset: _Optional[int] = ...) -> None: ...

class LogPosition(_message.Message):
    __slots__ = ("term", "offset", "checksum")
    TERM_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    CHECKSUM_FIELD_NUMBER: _ClassVar[int]
    term: int
    offset: int
    checksum: int
    def __init__(self, term: _Optional[int] = ..., offset: _Optional[int] = ..., checksum: _Optional[int] = ...) -> None: ...

class LogEntry(_message.Message):
    __slots__ = ("term", "offset", "checksum", "payload")
    TERM_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    CHECKSUM_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    term: int
    offset: int
    checksum: int
    payload: bytes
    def __init__(self, term: _Optional[int] = ..., offset: _Optional[int] = ..., checksum: _Optional[int] = ..., payload: _Optional[bytes] = ...) -> None: ...

class HashRange(_message.Message):
    __slots__ = ("min_hash_inclusive", "max_hash_inclusive")
    MIN_HASH_INCLUSIVE_FIELD_NUMBER: _ClassVar[int]
    MAX_HASH_INCLUSIVE_FIELD_NUMBER: _ClassVar[int]
    min_hash_inclusive: int
    max_hash_inclusive: int
    def __init__(self, min_hash_inclusive: _Optional[int] = ..., max_hash_inclusive: _Optional[int] = ...) -> None: ...

class Empty(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class RebuildFromArchiveRequest(_message.Message):
    __slots__ = ("plan",)
    PLAN_FIELD_NUMBER: _ClassVar[int]
    plan: bytes
    def __init__(self, plan: _Optional[bytes] = ...) -> None: ...

class NewTermRequest(_message.Message):
    __slots__ = ("namespace", "shard", "term")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    SHARD_FIELD_NUMBER: _ClassVar[int]
    TERM_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    shard: int
    term: int
    def __init__(self, namespace: _Optional[str] = ..., shard: _Optional[int] = ..., term: _Optional[int] = ...) -> None: ...

class NewTermResponse(_message.Message):
    __slots__ = ("namespace", "shard", "term", "head", "commit_offset", "incarnation")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    SHARD_FIELD_NUMBER: _ClassVar[int]
    TERM_FIELD_NUMBER: _ClassVar[int]
    HEAD_FIELD_NUMBER: _ClassVar[int]
    COMMIT_OFFSET_FIELD_NUMBER: _ClassVar[int]
    INCARNATION_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    shard: int
    term: int
    head: LogPosition
    commit_offset: int
    incarnation: str
    def __init__(self, namespace: _Optional[str] = ..., shard: _Optional[int] = ..., term: _Optional[int] = ..., head: _Optional[_Union[LogPosition, _Mapping]] = ..., commit_offset: _Optional[int] = ..., incarnation: _Optional[str] = ...) -> None: ...

class BecomeLeaderRequest(_message.Message):
    __slots__ = ("namespace", "shard", "term", "replication_factor", "follower_map")
    class FollowerMapEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: LogPosition
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[LogPosition, _Mapping]] = ...) -> None: ...
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    SHARD_FIELD_NUMBER: _ClassVar[int]
    TERM_FIELD_NUMBER: _ClassVar[int]
    REPLICATION_FACTOR_FIELD_NUMBER: _ClassVar[int]
    FOLLOWER_MAP_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    shard: int
    term: int
    replication_factor: int
    follower_map: _containers.MessageMap[str, LogPosition]
    def __init__(self, namespace: _Optional[str] = ..., shard: _Optional[int] = ..., term: _Optional[int] = ..., replication_factor: _Optional[int] = ..., follower_map: _Optional[_Mapping[str, LogPosition]] = ...) -> None: ...

class BecomeLeaderResponse(_message.Message):
    __slots__ = ("namespace", "shard", "term", "head")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    SHARD_FIELD_NUMBER: _ClassVar[int]
    TERM_FIELD_NUMBER: _ClassVar[int]
    HEAD_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    shard: int
    term: int
    head: LogPosition
    def __init__(self, namespace: _Optional[str] = ..., shard: _Optional[int] = ..., term: _Optional[int] = ..., head: _Optional[_Union[LogPosition, _Mapping]] = ...) -> None: ...

class AddFollowerRequest(_message.Message):
    __slots__ = ("namespace", "shard", "term", "follower_name", "follower_head")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    SHARD_FIELD_NUMBER: _ClassVar[int]
    TERM_FIELD_NUMBER: _ClassVar[int]
    FOLLOWER_NAME_FIELD_NUMBER: _ClassVar[int]
    FOLLOWER_HEAD_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    shard: int
    term: int
    follower_name: str
    follower_head: LogPosition
    def __init__(self, namespace: _Optional[str] = ..., shard: _Optional[int] = ..., term: _Optional[int] = ..., follower_name: _Optional[str] = ..., follower_head: _Optional[_Union[LogPosition, _Mapping]] = ...) -> None: ...

class AddFollowerResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GetStatusRequest(_message.Message):
    __slots__ = ("namespace", "shard")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    SHARD_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    shard: int
    def __init__(self, namespace: _Optional[str] = ..., shard: _Optional[int] = ...) -> None: ...

class FollowerStatus(_message.Message):
    __slots__ = ("name", "acked_offset", "last_pushed_offset", "in_sync")
    NAME_FIELD_NUMBER: _ClassVar[int]
    ACKED_OFFSET_FIELD_NUMBER: _ClassVar[int]
    LAST_PUSHED_OFFSET_FIELD_NUMBER: _ClassVar[int]
    IN_SYNC_FIELD_NUMBER: _ClassVar[int]
    name: str
    acked_offset: int
    last_pushed_offset: int
    in_sync: bool
    def __init__(self, name: _Optional[str] = ..., acked_offset: _Optional[int] = ..., last_pushed_offset: _Optional[int] = ..., in_sync: _Optional[bool] = ...) -> None: ...

class GetStatusResponse(_message.Message):
    __slots__ = ("namespace", "shard", "term", "role", "head", "commit_offset", "followers")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    SHARD_FIELD_NUMBER: _ClassVar[int]
    TERM_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    HEAD_FIELD_NUMBER: _ClassVar[int]
    COMMIT_OFFSET_FIELD_NUMBER: _ClassVar[int]
    FOLLOWERS_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    shard: int
    term: int
    role: ReplicaRole
    head: LogPosition
    commit_offset: int
    followers: _containers.RepeatedCompositeFieldContainer[FollowerStatus]
    def __init__(self, namespace: _Optional[str] = ..., shard: _Optional[int] = ..., term: _Optional[int] = ..., role: _Optional[_Union[ReplicaRole, str]] = ..., head: _Optional[_Union[LogPosition, _Mapping]] = ..., commit_offset: _Optional[int] = ..., followers: _Optional[_Iterable[_Union[FollowerStatus, _Mapping]]] = ...) -> None: ...

class HealthPing(_message.Message):
    __slots__ = ("ping_sequence", "internal_addresses", "client_addresses")
    class InternalAddressesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    class ClientAddressesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    PING_SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    INTERNAL_ADDRESSES_FIELD_NUMBER: _ClassVar[int]
    CLIENT_ADDRESSES_FIELD_NUMBER: _ClassVar[int]
    ping_sequence: int
    internal_addresses: _containers.ScalarMap[str, str]
    client_addresses: _containers.ScalarMap[str, str]
    def __init__(self, ping_sequence: _Optional[int] = ..., internal_addresses: _Optional[_Mapping[str, str]] = ..., client_addresses: _Optional[_Mapping[str, str]] = ...) -> None: ...

class ShardStatus(_message.Message):
    __slots__ = ("namespace", "shard", "term", "role", "head", "commit_offset", "followers", "node", "incarnation", "archive")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    SHARD_FIELD_NUMBER: _ClassVar[int]
    TERM_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    HEAD_FIELD_NUMBER: _ClassVar[int]
    COMMIT_OFFSET_FIELD_NUMBER: _ClassVar[int]
    FOLLOWERS_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    INCARNATION_FIELD_NUMBER: _ClassVar[int]
    ARCHIVE_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    shard: int
    term: int
    role: ReplicaRole
    head: LogPosition
    commit_offset: int
    followers: _containers.RepeatedCompositeFieldContainer[FollowerStatus]
    node: str
    incarnation: str
    archive: ArchiveStatus
    def __init__(self, namespace: _Optional[str] = ..., shard: _Optional[int] = ..., term: _Optional[int] = ..., role: _Optional[_Union[ReplicaRole, str]] = ..., head: _Optional[_Union[LogPosition, _Mapping]] = ..., commit_offset: _Optional[int] = ..., followers: _Optional[_Iterable[_Union[FollowerStatus, _Mapping]]] = ..., node: _Optional[str] = ..., incarnation: _Optional[str] = ..., archive: _Optional[_Union[ArchiveStatus, _Mapping]] = ...) -> None: ...

class ArchiveStatus(_message.Message):
    __slots__ = ("archived_offset", "lag_entries", "lag_seconds", "error")
    ARCHIVED_OFFSET_FIELD_NUMBER: _ClassVar[int]
    LAG_ENTRIES_FIELD_NUMBER: _ClassVar[int]
    LAG_SECONDS_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    archived_offset: int
    lag_entries: int
    lag_seconds: float
    error: str
    def __init__(self, archived_offset: _Optional[int] = ..., lag_entries: _Optional[int] = ..., lag_seconds: _Optional[float] = ..., error: _Optional[str] = ...) -> None: ...

class HealthReport(_message.Message):
    __slots__ = ("node_name", "sequence", "shards", "ping_sequence", "internal_address", "client_address")
    NODE_NAME_FIELD_NUMBER: _ClassVar[int]
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    SHARDS_FIELD_NUMBER: _ClassVar[int]
    PING_SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    INTERNAL_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    CLIENT_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    node_name: str
    sequence: int
    shards: _containers.RepeatedCompositeFieldContainer[ShardStatus]
    ping_sequence: int
    internal_address: str
    client_address: str
    def __init__(self, node_name: _Optional[str] = ..., sequence: _Optional[int] = ..., shards: _Optional[_Iterable[_Union[ShardStatus, _Mapping]]] = ..., ping_sequence: _Optional[int] = ..., internal_address: _Optional[str] = ..., client_address: _Optional[str] = ...) -> None: ...

class ShardAssignmentsUpdate(_message.Message):
    __slots__ = ("version", "namespaces")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    NAMESPACES_FIELD_NUMBER: _ClassVar[int]
    version: int
    namespaces: _containers.RepeatedCompositeFieldContainer[NamespaceAssignments]
    def __init__(self, version: _Optional[int] = ..., namespaces: _Optional[_Iterable[_Union[NamespaceAssignments, _Mapping]]] = ...) -> None: ...

class NamespaceAssignments(_message.Message):
    __slots__ = ("namespace", "shards")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    SHARDS_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    shards: _containers.RepeatedCompositeFieldContainer[ShardAssignment]
    def __init__(self, namespace: _Optional[str] = ..., shards: _Optional[_Iterable[_Union[ShardAssignment, _Mapping]]] = ...) -> None: ...

class ShardAssignment(_message.Message):
    __slots__ = ("shard", "hash_range", "term", "leader", "followers")
    SHARD_FIELD_NUMBER: _ClassVar[int]
    HASH_RANGE_FIELD_NUMBER: _ClassVar[int]
    TERM_FIELD_NUMBER: _ClassVar[int]
    LEADER_FIELD_NUMBER: _ClassVar[int]
    FOLLOWERS_FIELD_NUMBER: _ClassVar[int]
    shard: int
    hash_range: HashRange
    term: int
    leader: str
    followers: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, shard: _Optional[int] = ..., hash_range: _Optional[_Union[HashRange, _Mapping]] = ..., term: _Optional[int] = ..., leader: _Optional[str] = ..., followers: _Optional[_Iterable[str]] = ...) -> None: ...

class Append(_message.Message):
    __slots__ = ("namespace", "shard", "term", "commit_offset", "prev_checksum", "entries", "leader_name", "prev_offset", "prev_term")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    SHARD_FIELD_NUMBER: _ClassVar[int]
    TERM_FIELD_NUMBER: _ClassVar[int]
    COMMIT_OFFSET_FIELD_NUMBER: _ClassVar[int]
    PREV_CHECKSUM_FIELD_NUMBER: _ClassVar[int]
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    LEADER_NAME_FIELD_NUMBER: _ClassVar[int]
    PREV_OFFSET_FIELD_NUMBER: _ClassVar[int]
    PREV_TERM_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    shard: int
    term: int
    commit_offset: int
    prev_checksum: int
    entries: _containers.RepeatedCompositeFieldContainer[LogEntry]
    leader_name: str
    prev_offset: int
    prev_term: int
    def __init__(self, namespace: _Optional[str] = ..., shard: _Optional[int] = ..., term: _Optional[int] = ..., commit_offset: _Optional[int] = ..., prev_checksum: _Optional[int] = ..., entries: _Optional[_Iterable[_Union[LogEntry, _Mapping]]] = ..., leader_name: _Optional[str] = ..., prev_offset: _Optional[int] = ..., prev_term: _Optional[int] = ...) -> None: ...

class Ack(_message.Message):
    __slots__ = ("namespace", "shard", "term", "head_offset", "commit_offset", "status", "follower_head")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    SHARD_FIELD_NUMBER: _ClassVar[int]
    TERM_FIELD_NUMBER: _ClassVar[int]
    HEAD_OFFSET_FIELD_NUMBER: _ClassVar[int]
    COMMIT_OFFSET_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    FOLLOWER_HEAD_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    shard: int
    term: int
    head_offset: int
    commit_offset: int
    status: AckStatus
    follower_head: LogPosition
    def __init__(self, namespace: _Optional[str] = ..., shard: _Optional[int] = ..., term: _Optional[int] = ..., head_offset: _Optional[int] = ..., commit_offset: _Optional[int] = ..., status: _Optional[_Union[AckStatus, str]] = ..., follower_head: _Optional[_Union[LogPosition, _Mapping]] = ...) -> None: ...

class TruncateRequest(_message.Message):
    __slots__ = ("namespace", "shard", "term", "head", "leader_name", "follower_head")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    SHARD_FIELD_NUMBER: _ClassVar[int]
    TERM_FIELD_NUMBER: _ClassVar[int]
    HEAD_FIELD_NUMBER: _ClassVar[int]
    LEADER_NAME_FIELD_NUMBER: _ClassVar[int]
    FOLLOWER_HEAD_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    shard: int
    term: int
    head: LogPosition
    leader_name: str
    follower_head: LogPosition
    def __init__(self, namespace: _Optional[str] = ..., shard: _Optional[int] = ..., term: _Optional[int] = ..., head: _Optional[_Union[LogPosition, _Mapping]] = ..., leader_name: _Optional[str] = ..., follower_head: _Optional[_Union[LogPosition, _Mapping]] = ...) -> None: ...

class TruncateResponse(_message.Message):
    __slots__ = ("namespace", "shard", "term", "head")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    SHARD_FIELD_NUMBER: _ClassVar[int]
    TERM_FIELD_NUMBER: _ClassVar[int]
    HEAD_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    shard: int
    term: int
    head: LogPosition
    def __init__(self, namespace: _Optional[str] = ..., shard: _Optional[int] = ..., term: _Optional[int] = ..., head: _Optional[_Union[LogPosition, _Mapping]] = ...) -> None: ...

class SnapshotChunk(_message.Message):
    __slots__ = ("namespace", "shard", "term", "position", "data", "last", "leader_name")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    SHARD_FIELD_NUMBER: _ClassVar[int]
    TERM_FIELD_NUMBER: _ClassVar[int]
    POSITION_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    LAST_FIELD_NUMBER: _ClassVar[int]
    LEADER_NAME_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    shard: int
    term: int
    position: LogPosition
    data: bytes
    last: bool
    leader_name: str
    def __init__(self, namespace: _Optional[str] = ..., shard: _Optional[int] = ..., term: _Optional[int] = ..., position: _Optional[_Union[LogPosition, _Mapping]] = ..., data: _Optional[bytes] = ..., last: _Optional[bool] = ..., leader_name: _Optional[str] = ...) -> None: ...

class SnapshotResponse(_message.Message):
    __slots__ = ("namespace", "shard", "term", "head")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    SHARD_FIELD_NUMBER: _ClassVar[int]
    TERM_FIELD_NUMBER: _ClassVar[int]
    HEAD_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    shard: int
    term: int
    head: LogPosition
    def __init__(self, namespace: _Optional[str] = ..., shard: _Optional[int] = ..., term: _Optional[int] = ..., head: _Optional[_Union[LogPosition, _Mapping]] = ...) -> None: ...

class CoordinatorMetadata(_message.Message):
    __slots__ = ("version", "shards")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    SHARDS_FIELD_NUMBER: _ClassVar[int]
    version: int
    shards: _containers.RepeatedCompositeFieldContainer[ShardMetadata]
    def __init__(self, version: _Optional[int] = ..., shards: _Optional[_Iterable[_Union[ShardMetadata, _Mapping]]] = ...) -> None: ...

class ShardMetadata(_message.Message):
    __slots__ = ("namespace", "shard", "term", "leader", "ensemble", "hash_range", "status", "eligible", "last_known_commit_offset", "incarnations")
    class IncarnationsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    SHARD_FIELD_NUMBER: _ClassVar[int]
    TERM_FIELD_NUMBER: _ClassVar[int]
    LEADER_FIELD_NUMBER: _ClassVar[int]
    ENSEMBLE_FIELD_NUMBER: _ClassVar[int]
    HASH_RANGE_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    ELIGIBLE_FIELD_NUMBER: _ClassVar[int]
    LAST_KNOWN_COMMIT_OFFSET_FIELD_NUMBER: _ClassVar[int]
    INCARNATIONS_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    shard: int
    term: int
    leader: str
    ensemble: _containers.RepeatedScalarFieldContainer[str]
    hash_range: HashRange
    status: ShardState
    eligible: _containers.RepeatedScalarFieldContainer[str]
    last_known_commit_offset: int
    incarnations: _containers.ScalarMap[str, str]
    def __init__(self, namespace: _Optional[str] = ..., shard: _Optional[int] = ..., term: _Optional[int] = ..., leader: _Optional[str] = ..., ensemble: _Optional[_Iterable[str]] = ..., hash_range: _Optional[_Union[HashRange, _Mapping]] = ..., status: _Optional[_Union[ShardState, str]] = ..., eligible: _Optional[_Iterable[str]] = ..., last_known_commit_offset: _Optional[int] = ..., incarnations: _Optional[_Mapping[str, str]] = ...) -> None: ...

class ClusterStatus(_message.Message):
    __slots__ = ("metadata", "replicas", "nodes_alive", "node_addresses")
    class NodesAliveEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: bool
        def __init__(self, key: _Optional[str] = ..., value: _Optional[bool] = ...) -> None: ...
    class NodeAddressesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    METADATA_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    NODES_ALIVE_FIELD_NUMBER: _ClassVar[int]
    NODE_ADDRESSES_FIELD_NUMBER: _ClassVar[int]
    metadata: CoordinatorMetadata
    replicas: _containers.RepeatedCompositeFieldContainer[ShardStatus]
    nodes_alive: _containers.ScalarMap[str, bool]
    node_addresses: _containers.ScalarMap[str, str]
    def __init__(self, metadata: _Optional[_Union[CoordinatorMetadata, _Mapping]] = ..., replicas: _Optional[_Iterable[_Union[ShardStatus, _Mapping]]] = ..., nodes_alive: _Optional[_Mapping[str, bool]] = ..., node_addresses: _Optional[_Mapping[str, str]] = ...) -> None: ...

class RegisterRequest(_message.Message):
    __slots__ = ("node_name", "client_address", "internal_address")
    NODE_NAME_FIELD_NUMBER: _ClassVar[int]
    CLIENT_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    INTERNAL_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    node_name: str
    client_address: str
    internal_address: str
    def __init__(self, node_name: _Optional[str] = ..., client_address: _Optional[str] = ..., internal_address: _Optional[str] = ...) -> None: ...

class RegisterResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...
