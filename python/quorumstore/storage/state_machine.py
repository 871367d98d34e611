"""A shard's KV as the application of the committed log prefix, applied exactly once.

Every entry is applied with ONE atomic KV write that also records the entry's
position (`applied`) and the version counter (`next_version_id`) under internal
keys. After a crash the KV is therefore exactly the application of some prefix of
the log, and re-applying the log from the start skips what that prefix holds.

This module orders and commits entries: the gap and divergence checks, exactly-once
retries, staged writes, and the apply computed ahead of its commit (`prepare`). What
an entry's ops do is computed by the columnar apply (`columnar_apply`) where it
takes the entry, else by the per-op apply (`apply`).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import NamedTuple

import pyarrow as pa

from quorumstore.protocol.types import LogEntry, LogPosition
from quorumstore.storage import change_log, staging
from quorumstore.storage.apply import apply_ops
from quorumstore.storage.columnar_apply import apply_plain_puts, leading_range_deletes
from quorumstore.storage.kv import KvStore, KvWrite
from quorumstore.storage.reads import (
    APPLIED_KEY,
    COUNTER,
    NEXT_VERSION_ID_KEY,
    ShardReader,
    pack_position,
    read_applied_position,
    read_next_version_id,
)
from quorumstore.storage.results import EntryResult, decode_results, encode_results
from quorumstore.storage.serials import decode_serial_record, serial_changes, serial_key
from quorumstore.storage.write_batch import (
    InvalidBatchError,
    Staging,
    StagingKind,
    batch_origin,
    batch_staging,
    batch_timestamp_ms,
    decode_batch,
    utf8_valid,
)
from quorumstore.wire.metadata import ClientSerial


class LogGapError(RuntimeError):
    """An entry does not directly follow the last applied one."""


class LogDivergenceError(RuntimeError):
    """An entry at the applied offset differs from the one that was applied there."""


class _Prepared(NamedTuple):
    """An entry's apply computed ahead of its commit (`ShardStateMachine.prepare`)."""

    #: The applied position it was computed on.
    base: LogPosition
    #: The entry's own position.
    position: LogPosition
    write: KvWrite
    next_version_id: int
    result: EntryResult | None


class _NotPrepared(Exception):
    """An entry `ShardStateMachine.prepare` leaves to the apply proper."""


class ShardStateMachine(ShardReader):
    """Applies committed entries to a KvStore, each exactly once, in offset order.

    Create it after every (re)open of the KV, and after installing a snapshot into
    it: the applied position and the version counter are read from the KV here.
    """

    def __init__(self, kv: KvStore) -> None:
        super().__init__(kv)
        self._store = kv
        self._applied = read_applied_position(kv)
        self._next_version_id = read_next_version_id(kv)
        #: The next entry's apply, computed ahead of its commit (`prepare`).
        self._prepared: _Prepared | None = None
        #: While `prepare` runs: where the apply's KV write goes instead of the KV.
        self._capture: list[_Prepared] | None = None

    @property
    def applied_position(self) -> LogPosition:
        return self._applied

    @property
    def next_version_id(self) -> int:
        return self._next_version_id

    def apply(self, entries: Sequence[LogEntry]) -> list[EntryResult | None]:
        """Apply `entries` in order; None for each one already applied before.

        Re-applied entries happen only after a crash, when nobody waits for their
        results, so those are not reconstructed.
        """
        results: list[EntryResult | None] = []
        for entry in entries:
            applied = self._applied
            if entry.offset < applied.offset:
                results.append(None)
            elif entry.offset == applied.offset:
                if (entry.term, entry.checksum) != (applied.term, applied.checksum):
                    raise LogDivergenceError(
                        f"entry at offset {entry.offset} has term {entry.term} and checksum "
                        f"{entry.checksum:#x}, but the applied one had term {applied.term} and "
                        f"checksum {applied.checksum:#x}"
                    )
                results.append(None)
            elif entry.offset == applied.offset + 1:
                prepared = self._apply_prepared(entry)
                results.append(self._apply_entry(entry) if prepared is None else prepared)
            else:
                raise LogGapError(
                    f"cannot apply entry at offset {entry.offset}: last applied offset is "
                    f"{applied.offset}, so the next one must be {applied.offset + 1}"
                )
        return results

    def prepare(self, entry: LogEntry) -> bool:
        """Computes the apply of `entry`, the next entry to apply, without making it, so
        that applying it later only writes the KV batch computed now.

        A leader prepares the entry it waits on a quorum for: its loop is idle then, and
        the apply (milliseconds for 64 puts) leaves its clients' wait. The apply's
        outcome depends only on the KV and the entry, so `apply` uses the prepared one
        if the entry at that offset is the same (term, offset and chain checksum) and
        nothing was applied since; otherwise, or at the next apply of any entry, it is
        dropped. False, preparing nothing, for an entry that is not the next one, one of
        a staged write (a publish reads all its pieces), or one whose apply fails (the
        apply proper raises the error then). Preparing the prepared entry again (a
        retransmitted Append is written too) does nothing.
        """
        if self._prepared_for(entry) is not None:
            return True
        self._prepared = None
        if entry.offset != self._applied.offset + 1:
            return False
        captured: list[_Prepared] = []
        self._capture = captured
        try:
            result = self._apply_entry(entry)
            (prepared,) = captured  # every apply makes one KV write
        except Exception:  # noqa: BLE001 - the apply proper meets the same error
            return False
        finally:
            self._capture = None
        self._prepared = prepared._replace(result=result)
        return True

    def _prepared_for(self, entry: LogEntry) -> _Prepared | None:
        """The prepared apply, if it is of `entry` on the current state."""
        prepared = self._prepared
        if (
            prepared is None
            or prepared.base != self._applied
            or prepared.position != entry.position
        ):
            return None
        return prepared

    def _apply_prepared(self, entry: LogEntry) -> EntryResult | None:
        """Applies `entry` by writing its prepared KV batch, if it is the entry prepared
        on the current state; None otherwise. The prepared apply is used up either way."""
        prepared, self._prepared = self._prepared_for(entry), None
        if prepared is None:
            return None
        self._commit(prepared.write, prepared.position, prepared.next_version_id)
        return prepared.result

    def _commit(self, write: KvWrite, position: LogPosition, next_version_id: int) -> None:
        """Makes an entry's KV write (the applied position among its puts) and moves the
        applied position and version counter with it; while `prepare` runs, only notes
        them."""
        if self._capture is not None:
            puts, deletes, ranges = write
            self._capture.append(
                _Prepared(
                    self._applied, position, (list(puts), deletes, ranges), next_version_id, None
                )
            )
            return
        self._store.write(*write)
        self._applied = position
        self._next_version_id = next_version_id

    def _apply_entry(self, entry: LogEntry) -> EntryResult:
        try:
            batch = decode_batch(entry.payload)
        except InvalidBatchError as e:
            self._consume_offset(entry.position, None)
            return EntryResult(entry.offset, [], invalid=f"entry {entry.offset}: {e}")
        now = batch_timestamp_ms(batch)
        position = entry.position
        stage = batch_staging(batch)
        if stage is not None and self._capture is not None:
            raise _NotPrepared(f"entry {entry.offset} is part of staged write {stage.name}")
        # A publish's pieces go in its own KV write, whatever the outcome.
        drop = None
        if stage is not None:
            if stage.kind is not StagingKind.PUBLISH:
                return self._apply_staging(entry, now, position, stage)
            drop = staging.name_range(stage.name)
        origin = batch_origin(batch)
        previous_serial = None
        if origin is not None:
            previous_serial = self._store.get(serial_key(origin.client_id))
            if previous_serial is not None:
                last, _, stored_results = decode_serial_record(previous_serial)
                if origin.serial <= last:
                    # A retry of a write that already took effect: consume the offset only.
                    self._consume_offset(position, drop)
                    original = decode_results(stored_results) if origin.serial == last else []
                    return EntryResult(entry.offset, original, duplicate=True)
        if stage is not None:
            try:
                pieces = staging.read_pieces(self._store, stage.name)
            except InvalidBatchError as e:  # kept by an older leader, which checked less
                self._consume_offset(position, drop)
                return EntryResult(entry.offset, [], invalid=f"entry {entry.offset}: a piece: {e}")
            if len(pieces) != stage.number:
                self._consume_offset(position, drop)
                return EntryResult(
                    entry.offset,
                    [],
                    refused=f"stage {stage.name} holds {len(pieces)} of its {stage.number} "
                    "pieces here: the write was discarded while it was being published",
                )
            metadata = dict(batch.schema.metadata or {})
            for key in stage.metadata():
                metadata.pop(key)
            batch = pa.concat_batches(
                [batch.replace_schema_metadata(None), *pieces]
            ).replace_schema_metadata(metadata)
            del pieces  # the publish holds its rows once, not twice, while it applies them
        utf8 = utf8_valid(batch)
        # The columnar apply takes only batches whose every string is UTF-8.
        leading_ranges = leading_range_deletes(batch) if utf8 else None
        if leading_ranges is not None:
            applied_columnar = self._apply_plain_puts(
                entry.offset, batch, leading_ranges, now, position, origin, previous_serial, drop
            )
            if applied_columnar is not None:
                return applied_columnar
        applied = apply_ops(self._store, batch, now, self._next_version_id, utf8)
        self._write_entry(
            entry.offset,
            now,
            position,
            applied.next_version_id,
            applied.write,
            applied.changes,
            None
            if origin is None
            else (origin, encode_results(applied.results, applied.heads), previous_serial),
            drop,
        )
        return EntryResult(entry.offset, applied.results, invalid=applied.invalid)

    def _apply_plain_puts(
        self,
        offset: int,
        entry_batch: pa.RecordBatch,
        leading_ranges: int,
        now: int,
        position: LogPosition,
        origin: ClientSerial | None,
        previous_serial: bytes | None,
        drop: tuple[bytes, bytes] | None,
    ) -> EntryResult | None:
        """Applies an entry of `leading_ranges` range deletes, then plain puts, column by
        column (`columnar_apply`); None, having changed nothing, when it needs the loop."""
        columnar = apply_plain_puts(
            self._store, entry_batch, leading_ranges, now, self._next_version_id, origin is not None
        )
        if columnar is None:
            return None
        serial = None
        if origin is not None and columnar.encoded_results is not None:
            serial = (origin, columnar.encoded_results, previous_serial)
        self._write_entry(
            offset,
            now,
            position,
            columnar.next_version_id,
            columnar.write,
            columnar.changes,
            serial,
            drop,
        )
        return EntryResult(offset, columnar.results)

    def _consume_offset(self, position: LogPosition, drop: tuple[bytes, bytes] | None) -> None:
        """Records `position` as applied, changing nothing else but dropping `drop`'s range."""
        self._commit(
            ([(APPLIED_KEY, pack_position(position))], [], [drop] if drop else []),
            position,
            self._next_version_id,
        )

    def _apply_staging(
        self, entry: LogEntry, now: int, position: LogPosition, stage: Staging
    ) -> EntryResult:
        """Keeps a piece of a staged write, or drops a discarded write's pieces."""
        puts: list[tuple[bytes, bytes]] = []
        ranges: list[tuple[bytes, bytes]] = []
        if stage.kind is StagingKind.PIECE:
            record = staging.piece_record(now, entry.payload)
            puts.append((staging.piece_key(stage.name, stage.number), record))
        else:
            ranges.append(staging.name_range(stage.name))
        self._write_entry(
            entry.offset, now, position, self._next_version_id, (puts, [], ranges), None, None
        )
        return EntryResult(entry.offset, [])

    def _write_entry(
        self,
        offset: int,
        now: int,
        position: LogPosition,
        next_version_id: int,
        writes: KvWrite,
        change_batch: pa.RecordBatch | None,
        serial: tuple[ClientSerial, bytes, bytes | None] | None,
        drop: tuple[bytes, bytes] | None = None,
    ) -> None:
        """Writes an entry's changes (`writes`: puts, deletes, delete ranges) in one atomic
        batch with the applied position, version counter, change-log record and, for an
        exactly-once write (`serial`: origin, encoded results, previous serial record),
        the client's serial; `drop` is one more range to delete (published pieces)."""
        puts, deletes, ranges = writes
        if drop is not None:
            ranges = [*ranges, drop]
        more_puts = [
            (APPLIED_KEY, pack_position(position)),
            (NEXT_VERSION_ID_KEY, COUNTER.pack(next_version_id)),
        ]
        if serial is not None:
            origin, results, previous_serial = serial
            serial_puts, serial_deletes = serial_changes(
                self._store, origin.client_id, origin.serial, now, results, previous_serial
            )
            more_puts.extend(serial_puts)
            deletes.extend(serial_deletes)
        change_puts, change_deletes = change_log.record_changes(
            self._store, offset, now, change_batch
        )
        more_puts.extend(change_puts)
        deletes.extend(change_deletes)
        self._commit((itertools.chain(puts, more_puts), deletes, ranges), position, next_version_id)
