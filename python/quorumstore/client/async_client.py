"""`AsyncClient`: quorumstore's asyncio client over the Oxia protocol.

    async with AsyncClient("127.0.0.1:6648") as client:
        version = await client.put("/users/7", b"ada")
        key, value, version = await client.get("/users/7")

Every operation goes to its shard's batcher (`batcher.py`): concurrent puts and
deletes of a shard travel as one replicated write, concurrent gets as one `Read`,
with up to `max_inflight_batches` batches of each kind in flight per shard. Writes
are exactly-once by default (`writes.py`): a batch retried after a leader change is
applied once. The shard map follows the cluster (`discovery.py`), and requests are
retried across leader changes until `request_timeout_s` (`calls.py`).

The class is assembled from its parts: the connection (`core.py`), the writes
(`write_api.py`) and the reads (`read_api.py`); the subscriptions to changes and
to sequences are here.
"""

from __future__ import annotations

from collections.abc import Mapping

from quorumstore.client.arguments import check_key
from quorumstore.client.notifications import Subscription
from quorumstore.client.read_api import ReadApi
from quorumstore.client.sequences import SequenceSubscription
from quorumstore.client.write_api import WriteApi


class AsyncClient(WriteApi, ReadApi):
    """A quorumstore client for asyncio code.

    Open it with `async with AsyncClient(address) as client` (or `await connect()`
    and `await close()`). `address` is any node's `host:port`, or several (a list,
    or comma-separated): the client learns the other nodes from the cluster.

    Options (docs/client.md has the details):
      namespace: the namespace to use (default "default").
      linger_ms: how long a partial batch of an idle shard waits for more
        operations: until none arrived for this long, at most 4x after its first.
        The default 0 sends it once the event loop has run every ready task; under
        load batches form anyway, behind the partial batch in flight.
      max_batch_ops, max_batch_bytes: a batch is full at either.
      max_inflight_batches: batches of each kind (write, read) in flight per shard;
        of them, one partial batch at a time (full ones use the rest).
      request_timeout_s: how long an operation is retried across leader changes and
        outages before it fails with ServiceUnavailable.
      connect_timeout_s: how long `connect` waits for the first shard map.
      exactly_once: tag write batches with a client id and serial so that a retried
        batch is applied once (default True).
      session_timeout_ms: how long the cluster keeps the client's ephemeral records
        after its last keep-alive (2,000 to 300,000; default 30,000).
      client_identifier: recorded with each ephemeral record (default `client_id`).
      tls: a `TlsConfig` (`TlsConfig.from_files(None, None, "ca.pem")`): the nodes are
        reached over TLS and checked against its trusted CA.
      token: a bearer token, or a function returning the current one, presented on
        every call (sent only over TLS or loopback).
    """

    def notifications(
        self,
        shard: int | None = None,
        *,
        start_offset_exclusive: int | Mapping[int, int] | None = None,
    ) -> Subscription:
        """Follows the changes of one shard, or of all shards.

        `async with client.notifications() as changes: async for n in changes: ...`
        (entering waits until every shard's stream has started, so every change
        committed after it is delivered).

        start_offset_exclusive: resume after this offset (an int, with `shard`), or
          after these offsets per shard (a mapping, e.g. an earlier subscription's
          `offsets`); shards without one start at their current end.
        """
        directory = self._ready()
        assert self._caller is not None
        if isinstance(start_offset_exclusive, int):
            if shard is None:
                raise ValueError(
                    "an int start_offset_exclusive needs a shard: offsets are per shard "
                    "(pass a mapping of shard to offset to resume several shards)"
                )
            start_offset_exclusive = {shard: start_offset_exclusive}
        shards = directory.map.shards if shard is None else [shard]
        subscription = Subscription(self._caller, shards, start_offset_exclusive or {})
        self._subscriptions.add(subscription)
        return subscription

    def sequence_updates(self, prefix_key: str, *, partition_key: str) -> SequenceSubscription:
        """Follows the sequence at `prefix_key`: yields its highest key each time a
        `put_sequence` extends it (the current one first, if the sequence has keys).

        `async with client.sequence_updates("/q", partition_key="q") as keys:
        async for key in keys: ...`. A reader that falls behind gets the newest key.
        """
        directory = self._ready()
        check_key(prefix_key, "prefix_key")
        assert self._caller is not None
        shard = self._route(directory, prefix_key, partition_key)
        subscription = SequenceSubscription(self._caller, shard, prefix_key)
        self._subscriptions.add(subscription)
        return subscription
