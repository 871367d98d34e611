from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ShardKeyRouter(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    UNKNOWN: _ClassVar[ShardKeyRouter]
    XXHASH3: _ClassVar[ShardKeyRouter]

class KeyComparisonType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    EQUAL: _ClassVar[KeyComparisonType]
    FLOOR: _ClassVar[KeyComparisonType]
    CEILING: _ClassVar[KeyComparisonType]
    LOWER: _ClassVar[KeyComparisonType]
    HIGHER: _ClassVar[KeyComparisonType]

class Status(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    OK: _ClassVar[Status]
    KEY_NOT_FOUND: _ClassVar[Status]
    UNEXPECTED_VERSION_ID: _ClassVar[Status]
    SESSION_DOES_NOT_EXIST: _ClassVar[Status]

class NotificationType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    KEY_CREATED: _ClassVar[NotificationType]
    KEY_MODIFIED: _ClassVar[NotificationType]
    KEY_DELETED: _ClassVar[NotificationType]
    KEY_RANGE_DELETED: _ClassVar[NotificationType]
UNKNOWN: ShardKeyRouter
XXHASH3: ShardKeyRouter
EQUAL: KeyComparisonType
FLOOR: KeyComparisonType
CEILING: KeyComparisonType
LOWER: KeyComparisonType
HIGHER: KeyComparisonType
OK: Status
KEY_NOT_FOUND: Status
UNEXPECTED_VERSION_ID: Status
SESSION_DOES_NOT_EXIST: Status
KEY_CREATED: NotificationType
KEY_MODIFIED: NotificationType
KEY_DELETED: NotificationType
KEY_RANGE_DELETED: NotificationType

class ShardAssignmentsRequest(_message.Message):
    __slots__ = ("namespace",)
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    def __init__(self, namespace: _Optional[str] = ...) -> None: ...

class ShardAssignments(_message.Message):
    __slots__ = ("namespaces",)
    class NamespacesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: NamespaceShardsAssignment
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[NamespaceShardsAssignment, _Mapping]] = ...) -> None: ...
    NAMESPACES_FIELD_NUMBER: _ClassVar[int]
    namespaces: _containers.MessageMap[str, NamespaceShardsAssignment]
    def __init__(self, namespaces: _Optional[_Mapping[str, NamespaceShardsAssignment]] = ...) -> None: ...

class NamespaceShardsAssignment(_message.Message):
    __slots__ = ("assignments", "shard_key_router")
    ASSIGNMENTS_FIELD_NUMBER: _ClassVar[int]
    SHARD_KEY_ROUTER_FIELD_NUMBER: _ClassVar[int]
    assignments: _containers.RepeatedCompositeFieldContainer[ShardAssignment]
    shard_key_router: ShardKeyRouter
    def __init__(self, assignments: _Optional[_Iterable[_Union[ShardAssignment, _Mapping]]] = ..., shard_key_router: _Optional[_Union[ShardKeyRouter, str]] = ...) -> None: ...

class ShardAssignment(_message.Message):
    __slots__ = ("shard", "leader", "int32_hash_range")
    SHARD_FIELD_NUMBER: _ClassVar[int]
    LEADER_FIELD_NUMBER: _ClassVar[int]
    INT32_HASH_RANGE_FIELD_NUMBER: _ClassVar[int]
    shard: int
    leader: str
    int32_hash_range: Int32HashRange
    def __init__(self, shard: _Optional[int] = ..., leader: _Optional[str] = ..., int32_hash_range: _Optional[_Union[Int32HashRange, _Mapping]] = ...) -> None: ...

class Int32HashRange(_message.Message):
    __slots__ = ("min_hash_inclusive", "max_hash_inclusive")
    MIN_HASH_INCLUSIVE_FIELD_NUMBER: _ClassVar[int]
    MAX_HASH_INCLUSIVE_FIELD_NUMBER: _ClassVar[int]
    min_hash_inclusive: int
    max_hash_inclusive: int
    def __init__(self, min_hash_inclusive: _Optional[int] = ..., max_hash_inclusive: _Optional[int] = ...) -> None: ...

class WriteRequest(_message.Message):
    __slots__ = ("shard", "puts", "deletes", "delete_ranges")
    SHARD_FIELD_NUMBER: _ClassVar[int]
    PUTS_FIELD_NUMBER: _ClassVar[int]
    DELETES_FIELD_NUMBER: _ClassVar[int]
    DELETE_RANGES_FIELD_NUMBER: _ClassVar[int]
    shard: int
    puts: _containers.RepeatedCompositeFieldContainer[PutRequest]
    deletes: _containers.RepeatedCompositeFieldContainer[DeleteRequest]
    delete_ranges: _containers.RepeatedCompositeFieldContainer[DeleteRangeRequest]
    def __init__(self, shard: _Optional[int] = ..., puts: _Optional[_Iterable[_Union[PutRequest, _Mapping]]] = ..., deletes: _Optional[_Iterable[_Union[DeleteRequest, _Mapping]]] = ..., delete_ranges: _Optional[_Iterable[_Union[DeleteRangeRequest, _Mapping]]] = ...) -> None: ...

class WriteResponse(_message.Message):
    __slots__ = ("puts", "deletes", "delete_ranges")
    PUTS_FIELD_NUMBER: _ClassVar[int]
    DELETES_FIELD_NUMBER: _ClassVar[int]
    DELETE_RANGES_FIELD_NUMBER: _ClassVar[int]
    puts: _containers.RepeatedCompositeFieldContainer[PutResponse]
    deletes: _containers.RepeatedCompositeFieldContainer[DeleteResponse]
    delete_ranges: _containers.RepeatedCompositeFieldContainer[DeleteRangeResponse]
    def __init__(self, puts: _Optional[_Iterable[_Union[PutResponse, _Mapping]]] = ..., deletes: _Optional[_Iterable[_Union[DeleteResponse, _Mapping]]] = ..., delete_ranges: _Optional[_Iterable[_Union[DeleteRangeResponse, _Mapping]]] = ...) -> None: ...

class ReadRequest(_message.Message):
    __slots__ = ("shard", "gets")
    SHARD_FIELD_NUMBER: _ClassVar[int]
    GETS_FIELD_NUMBER: _ClassVar[int]
    shard: int
    gets: _containers.RepeatedCompositeFieldContainer[GetRequest]
    def __init__(self, shard: _Optional[int] = ..., gets: _Optional[_Iterable[_Union[GetRequest, _Mapping]]] = ...) -> None: ...

class ReadResponse(_message.Message):
    __slots__ = ("gets",)
    GETS_FIELD_NUMBER: _ClassVar[int]
    gets: _containers.RepeatedCompositeFieldContainer[GetResponse]
    def __init__(self, gets: _Optional[_Iterable[_Union[GetResponse, _Mapping]]] = ...) -> None: ...

class SecondaryIndex(_message.Message):
    __slots__ = ("index_name", "secondary_key")
    INDEX_NAME_FIELD_NUMBER: _ClassVar[int]
    SECONDARY_KEY_FIELD_NUMBER: _ClassVar[int]
    index_name: str
    secondary_key: str
    def __init__(self, index_name: _Optional[str] = ..., secondary_key: _Optional[str] = ...) -> None: ...

class PutRequest(_message.Message):
    __slots__ = ("key", "value", "expected_version_id", "session_id", "client_identity", "partition_key", "sequence_key_delta", "secondary_indexes")
    KEY_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_VERSION_ID_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    CLIENT_IDENTITY_FIELD_NUMBER: _ClassVar[int]
    PARTITION_KEY_FIELD_NUMBER: _ClassVar[int]
    SEQUENCE_KEY_DELTA_FIELD_NUMBER: _ClassVar[int]
    SECONDARY_INDEXES_FIELD_NUMBER: _ClassVar[int]
    key: str
    value: bytes
    expected_version_id: int
    session_id: int
    client_identity: str
    partition_key: str
    sequence_key_delta: _containers.RepeatedScalarFieldContainer[int]
    secondary_indexes: _containers.RepeatedCompositeFieldContainer[SecondaryIndex]
    def __init__(self, key: _Optional[str] = ..., value: _Optional[bytes] = ..., expected_version_id: _Optional[int] = ..., session_id: _Optional[int] = ..., client_identity: _Optional[str] = ..., partition_key: _Optional[str] = ..., sequence_key_delta: _Optional[_Iterable[int]] = ..., secondary_indexes: _Optional[_Iterable[_Union[SecondaryIndex, _Mapping]]] = ...) -> None: ...

class PutResponse(_message.Message):
    __slots__ = ("status", "version", "key")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    status: Status
    version: Version
    key: str
    def __init__(self, status: _Optional[_Union[Status, str]] = ..., version: _Optional[_Union[Version, _Mapping]] = ..., key: _Optional[str] = ...) -> None: ...

class DeleteRequest(_message.Message):
    __slots__ = ("key", "expected_version_id")
    KEY_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_VERSION_ID_FIELD_NUMBER: _ClassVar[int]
    key: str
    expected_version_id: int
    def __init__(self, key: _Optional[str] = ..., expected_version_id: _Optional[int] = ...) -> None: ...

class DeleteResponse(_message.Message):
    __slots__ = ("status",)
    STATUS_FIELD_NUMBER: _ClassVar[int]
    status: Status
    def __init__(self, status: _Optional[_Union[Status, str]] = ...) -> None: ...

class GetRequest(_message.Message):
    __slots__ = ("key", "include_value", "comparison_type", "secondary_index_name")
    KEY_FIELD_NUMBER: _ClassVar[int]
    INCLUDE_VALUE_FIELD_NUMBER: _ClassVar[int]
    COMPARISON_TYPE_FIELD_NUMBER: _ClassVar[int]
    SECONDARY_INDEX_NAME_FIELD_NUMBER: _ClassVar[int]
    key: str
    include_value: bool
    comparison_type: KeyComparisonType
    secondary_index_name: str
    def __init__(self, key: _Optional[str] = ..., include_value: _Optional[bool] = ..., comparison_type: _Optional[_Union[KeyComparisonType, str]] = ..., secondary_index_name: _Optional[str] = ...) -> None: ...

class GetResponse(_message.Message):
    __slots__ = ("status", "version", "value", "key", "secondary_index_key")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    SECONDARY_INDEX_KEY_FIELD_NUMBER: _ClassVar[int]
    status: Status
    version: Version
    value: bytes
    key: str
    secondary_index_key: str
    def __init__(self, status: _Optional[_Union[Status, str]] = ..., version: _Optional[_Union[Version, _Mapping]] = ..., value: _Optional[bytes] = ..., key: _Optional[str] = ..., secondary_index_key: _Optional[str] = ...) -> None: ...

class DeleteRangeRequest(_message.Message):
    __slots__ = ("start_inclusive", "end_exclusive")
    START_INCLUSIVE_FIELD_NUMBER: _ClassVar[int]
    END_EXCLUSIVE_FIELD_NUMBER: _ClassVar[int]
    start_inclusive: str
    end_exclusive: str
    def __init__(self, start_inclusive: _Optional[str] = ..., end_exclusive: _Optional[str] = ...) -> None: ...

class DeleteRangeResponse(_message.Message):
    __slots__ = ("status",)
    STATUS_FIELD_NUMBER: _ClassVar[int]
    status: Status
    def __init__(self, status: _Optional[_Union[Status, str]] = ...) -> None: ...

class ListRequest(_message.Message):
    __slots__ = ("shard", "start_inclusive", "end_exclusive", "secondary_index_name")
    SHARD_FIELD_NUMBER: _ClassVar[int]
    START_INCLUSIVE_FIELD_NUMBER: _ClassVar[int]
    END_EXCLUSIVE_FIELD_NUMBER: _ClassVar[int]
    SECONDARY_INDEX_NAME_FIELD_NUMBER: _ClassVar[int]
    shard: int
    start_inclusive: str
    end_exclusive: str
    secondary_index_name: str
    def __init__(self, shard: _Optional[int] = ..., start_inclusive: _Optional[str] = ..., end_exclusive: _Optional[str] = ..., secondary_index_name: _Optional[str] = ...) -> None: ...

class ListResponse(_message.Message):
    __slots__ = ("keys",)
    KEYS_FIELD_NUMBER: _ClassVar[int]
    keys: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, keys: _Optional[_Iterable[str]] = ...) -> None: ...

class RangeScanRequest(_message.Message):
    __slots__ = ("shard", "start_inclusive", "end_exclusive", "secondary_index_name")
    SHARD_FIELD_NUMBER: _ClassVar[int]
    START_INCLUSIVE_FIELD_NUMBER: _ClassVar[int]
    END_EXCLUSIVE_FIELD_NUMBER: _ClassVar[int]
    SECONDARY_INDEX_NAME_FIELD_NUMBER: _ClassVar[int]
    shard: int
    start_inclusive: str
    end_exclusive: str
    secondary_index_name: str
    def __init__(self, shard: _Optional[int] = ..., start_inclusive: _Optional[str] = ..., end_exclusive: _Optional[str] = ..., secondary_index_name: _Optional[str] = ...) -> None: ...

class RangeScanResponse(_message.Message):
    __slots__ = ("records",)
    RECORDS_FIELD_NUMBER: _ClassVar[int]
    records: _containers.RepeatedCompositeFieldContainer[GetResponse]
    def __init__(self, records: _Optional[_Iterable[_Union[GetResponse, _Mapping]]] = ...) -> None: ...

class GetSequenceUpdatesRequest(_message.Message):
    __slots__ = ("shard", "key")
    SHARD_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    shard: int
    key: str
    def __init__(self, shard: _Optional[int] = ..., key: _Optional[str] = ...) -> None: ...

class GetSequenceUpdatesResponse(_message.Message):
    __slots__ = ("highest_sequence_key",)
    HIGHEST_SEQUENCE_KEY_FIELD_NUMBER: _ClassVar[int]
    highest_sequence_key: str
    def __init__(self, highest_sequence_key: _Optional[str] = ...) -> None: ...

class Version(_message.Message):
    __slots__ = ("version_id", "modifications_count", "created_timestamp", "modified_timestamp", "session_id", "client_identity")
    VERSION_ID_FIELD_NUMBER: _ClassVar[int]
    MODIFICATIONS_COUNT_FIELD_NUMBER: _ClassVar[int]
    CREATED_TIMESTAMP_FIELD_NUMBER: _ClassVar[int]
    MODIFIED_TIMESTAMP_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    CLIENT_IDENTITY_FIELD_NUMBER: _ClassVar[int]
    version_id: int
    modifications_count: int
    created_timestamp: int
    modified_timestamp: int
    session_id: int
    client_identity: str
    def __init__(self, version_id: _Optional[int] = ..., modifications_count: _Optional[int] = ..., created_timestamp: _Optional[int] = ..., modified_timestamp: _Optional[int] = ..., session_id: _Optional[int] = ..., client_identity: _Optional[str] = ...) -> None: ...

class CreateSessionRequest(_message.Message):
    __slots__ = ("shard", "session_timeout_ms", "client_identity")
    SHARD_FIELD_NUMBER: _ClassVar[int]
    SESSION_TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    CLIENT_IDENTITY_FIELD_NUMBER: _ClassVar[int]
    shard: int
    session_timeout_ms: int
    client_identity: str
    def __init__(self, shard: _Optional[int] = ..., session_timeout_ms: _Optional[int] = ..., client_identity: _Optional[str] = ...) -> None: ...

class CreateSessionResponse(_message.Message):
    __slots__ = ("session_id",)
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    session_id: int
    def __init__(self, session_id: _Optional[int] = ...) -> None: ...

class SessionHeartbeat(_message.Message):
    __slots__ = ("shard", "session_id")
    SHARD_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    shard: int
    session_id: int
    def __init__(self, shard: _Optional[int] = ..., session_id: _Optional[int] = ...) -> None: ...

class KeepAliveResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class CloseSessionRequest(_message.Message):
    __slots__ = ("shard", "session_id")
    SHARD_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    shard: int
    session_id: int
    def __init__(self, shard: _Optional[int] = ..., session_id: _Optional[int] = ...) -> None: ...

class CloseSessionResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class NotificationsRequest(_message.Message):
    __slots__ = ("shard", "start_offset_exclusive")
    SHARD_FIELD_NUMBER: _ClassVar[int]
    START_OFFSET_EXCLUSIVE_FIELD_NUMBER: _ClassVar[int]
    shard: int
    start_offset_exclusive: int
    def __init__(self, shard: _Optional[int] = ..., start_offset_exclusive: _Optional[int] = ...) -> None: ...

class NotificationBatch(_message.Message):
    __slots__ = ("shard", "offset", "timestamp", "notifications")
    class NotificationsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: Notification
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[Notification, _Mapping]] = ...) -> None: ...
    SHARD_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    TIMESTAMP_FIELD_NUMBER: _ClassVar[int]
    NOTIFICATIONS_FIELD_NUMBER: _ClassVar[int]
    shard: int
    offset: int
    timestamp: int
    notifications: _containers.MessageMap[str, Notification]
    def __init__(self, shard: _Optional[int] = ..., offset: _Optional[int] = ..., timestamp: _Optional[int] = ..., notifications: _Optional[_Mapping[str, Notification]] = ...) -> None: ...

class Notification(_message.Message):
    __slots__ = ("type", "version_id", "key_range_last")
    TYPE_FIELD_NUMBER: _ClassVar[int]
    VERSION_ID_FIELD_NUMBER: _ClassVar[int]
    KEY_RANGE_LAST_FIELD_NUMBER: _ClassVar[int]
    type: NotificationType
    version_id: int
    key_range_last: str
    def __init__(self, type: _Optional[_Union[NotificationType, str]] = ..., version_id: _Optional[int] = ..., key_range_last: _Optional[str] = ...) -> None: ...
