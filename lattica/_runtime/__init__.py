"""The actor runtime of one node, one concern per module (each imports only those above it):

- ``limits``: constants (method kinds, windows, limits, timeouts);
- ``partials``: the budget for partially received messages (per peer, per node, deadline);
- ``window``: a stream's item credit as its consumer keeps it (either direction), sans-IO;
- ``refs``: ``ActorRef`` and method tables, ``MethodHandle`` and ``StreamCall`` (the caller's
  handle on a call), and which runtime a call from this thread goes through;
- ``local``: local actor execution (instances, mailbox windows, async tasks, the pykka thread of
  sync methods), invocations and argument streams;
- ``client``: the caller's side (pending calls, the thread gate, call channels, frame writing,
  a path's round trip);
  channels reach the registry through the ``CallRouter`` protocol;
- ``server``: the callee's side (a peer's call stream, checked and handed to local actors);
- ``following``: stable-ref following (calls sent on to an actor's next incarnation, idempotent
  calls re-sent over the next path), a base of the ``Runtime``;
- ``registry``: the ``Runtime`` (actors, channels, calls in flight);
- ``ports``: what the runtime uses of the services above it, as protocols they are plugged in as
  (``Names``, ``MembershipView``, ``Blocks``);
- ``calls``: ``Calls``, the narrow view of the runtime a service is written against.
"""

from lattica._runtime.limits import (
    AGEN,
    ASYNC,
    BUILTIN_ACTORS,
    DEFAULT_MAX_CONCURRENCY,
    DEFAULT_WINDOW,
    GEN,
    LIFECYCLE_HOOKS,
    MAX_ACTORS,
    MAX_MESSAGE,
    NO_STATE,
    STREAM_WINDOW,
    SYNC,
)
from lattica._runtime.local import ArgStream, LocalActor
from lattica._runtime.refs import (
    ActorRef,
    MethodHandle,
    StreamArg,
    StreamCall,
    autonat_ref,
    current_actor,
    current_caller,
    current_runtime,
    method_table,
    on_loop,
    relay_ref,
    require_caller,
    run_coroutine,
    spawner_ref,
)
from lattica._runtime.registry import Runtime

__all__ = [
    "AGEN",
    "ASYNC",
    "ActorRef",
    "ArgStream",
    "BUILTIN_ACTORS",
    "DEFAULT_MAX_CONCURRENCY",
    "DEFAULT_WINDOW",
    "GEN",
    "LIFECYCLE_HOOKS",
    "LocalActor",
    "MAX_ACTORS",
    "MAX_MESSAGE",
    "MethodHandle",
    "NO_STATE",
    "Runtime",
    "STREAM_WINDOW",
    "SYNC",
    "StreamArg",
    "StreamCall",
    "current_actor",
    "current_caller",
    "current_runtime",
    "method_table",
    "on_loop",
    "require_caller",
    "run_coroutine",
    "spawner_ref",
    "autonat_ref",
    "relay_ref",
]
