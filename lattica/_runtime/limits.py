"""The runtime's constants: method kinds, mailbox and stream windows, message and actor limits,
and its timeouts."""

from __future__ import annotations

from typing import Any

from lattica import codec

ASYNC, SYNC, AGEN, GEN = "async", "sync", "agen", "gen"
DEFAULT_WINDOW = 1024  # calls in flight per caller per actor (the mailbox share of one caller)
DEFAULT_MAX_CONCURRENCY = 1000  # async calls running at once per actor (Ray's default)
STREAM_WINDOW = 16  # items a stream producer may send ahead of its consumer, to begin with
MAX_STREAM_WINDOW = 512  # ... once a long round trip asks for more (the consumer grows it: refs._StreamState)
STREAM_WINDOW_BYTES = 8 * 1024 * 1024  # a grown window holds at most this many bytes of items
MAX_MESSAGE = codec.DEFAULT_LIMITS.max_frame
CHANNEL_HIGH_WATER = 16 * 1024 * 1024  # unsent bytes on a channel before calls wait at the caller
MAX_STREAM_ARGS = 64
CALL_CHANNELS = (
    4  # call channels a peer may open to us on one connection (a caller uses one; more while one is replaced)
)
CHANNEL_IDLE = 60.0  # seconds a call channel with nothing in flight stays open
LIFECYCLE_HOOKS = frozenset({"on_start", "on_stop", "restore"})  # called by the runtime, never by peers
BUILTIN_ACTORS = ("lattica.supervisor.Supervisor",)  # actor classes any peer may spawn on any node
NO_STATE: Any = object()  # spawned without a checkpoint to restore
MAX_ACTORS = 10_000  # actors per node: every spawn beyond it is refused
# what all strangers together may have us read of their calls (public methods: the DHT, content,
# pub-sub ...), in units a second (and at once): a frame costs 1 + its size / STRANGER_UNIT (a DHT
# request ~1, a content ``have`` of 1,024 CIDs ~38). Beyond, their frames wait unread (flow
# control holds the senders back) and members' go on: the loop time strangers can take is bounded,
# however many identities they make (at 2,000 a second, spent, they took a quarter of a core)
STRANGERS_CALLS = (1000.0, 2000.0)
STRANGER_UNIT = 1024
HOOK_TIMEOUT = 10.0  # seconds an on_stop hook may take
IDENTIFY_WAIT = 5.0  # s a fresh connection's call channel waits for the peer's identify (one one-way delay, normally)
FOLLOW_FOR = 30.0  # seconds a stable ref keeps re-sending an undelivered call while its actor moves
RECENT_PLACEMENT = 5.0  # seconds a spawn we sent counts against its node (gossip lag)
