"""Shards of a service, served by actors anywhere on the mesh, called through stubs that pick a
provider by load and latency and try another when one fails (docs/shards.md).

    @lattica.actor
    class Stage:
        def forward(self, x): ...

    ref = Stage.remote(...)
    lattica.shards.serve(ref, "llm", {"model": "tiny", "layers": (0, 4)})   # on ref's node

    stage = lattica.shards.stub("llm", {"model": "tiny", "layers": (0, 4)}, timeout=5.0)
    y = stage.forward.remote(x).result()     # one provider; on failure another

The sans-IO parts: ``keys`` (shard ids, DHT records), ``select`` (the picker); ``client`` is the
stub, the calling side; the ``shards`` service (lattica.actors.shards) registers and finds providers.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from lattica._future import Future
from lattica._runtime import ASYNC, ActorRef, run_coroutine
from lattica.shards._keys import shard_id

if TYPE_CHECKING:
    from lattica._node import Node
    from lattica._runtime import Runtime
    from lattica.actors.shards import ShardsService
    from lattica.shards._client import Stub

__all__ = ["serve", "withdraw", "providers", "stub", "shard_id", "Stub", "StubMethod"]


def _service(node: Node | None) -> tuple[Runtime, ShardsService]:
    # the table imports every service, and services import parts of this package
    from lattica.services import running_services

    rt, services = running_services(node)
    return rt, services.shards


def serve(ref: ActorRef, service: str, shard: str | Mapping[str, Any], *, node: Node | None = None) -> Future:
    """Register ``ref`` as a provider of ``shard`` of ``service`` while it lives: an actor of this
    node (``node``: of that node), or one this node spawned on another (that node registers it; a
    node signs registrations of its own actors only). Registrations by strangers to the mesh are
    not followed. A Future, done once registered here (the DHT put follows at once). A ref just
    spawned is registered once its spawn has answered (its node could not find it before)."""
    rt, svc = _service(node)
    spawning = ref._spawn

    async def register() -> None:
        if spawning is not None:
            await spawning  # (raises the spawn's error: a provider that never started is not served)
        if ref.peer_id != rt.peer_id:  # (an actor we spawned there: its node registers it, for us)
            shards = ActorRef(ref.peer_id, "shards", {"serve": ASYNC})
            await rt.call(shards, "serve", (ref.name, service, shard_id(shard)), {}, timeout=10.0)
        else:
            await svc.serve(ref, service, shard)  # (registered once stored: a lookup right after finds it)

    return run_coroutine(rt, register)


def withdraw(ref: ActorRef, service: str, shard: str | Mapping[str, Any], *, node: Node | None = None) -> Future:
    """``ref`` no longer serves ``shard`` of ``service`` (its registration goes; an actor this
    node spawned on another: that node withdraws it)."""
    rt, svc = _service(node)
    if ref.peer_id != rt.peer_id:
        shards = ActorRef(ref.peer_id, "shards", {"withdraw": ASYNC})
        return rt.call(shards, "withdraw", (ref.name, service, shard_id(shard)), {}, timeout=10.0)

    async def here() -> None:
        svc.withdraw(ref, service, shard)

    return run_coroutine(rt, here)


def providers(service: str, shard: str | Mapping[str, Any], *, node: Node | None = None) -> Future:
    """A Future of ``[(actor ref, registered load)]``: the providers of ``shard`` of ``service``
    the DHT holds now."""
    rt, svc = _service(node)
    return run_coroutine(rt, lambda: svc.providers(service, shard, everywhere=True))


def stub(
    service: str,
    shard: str | Mapping[str, Any],
    *,
    timeout: float | None = None,
    within: float = 30.0,
    idempotent: bool = True,
    hedge: bool = True,
    node: Node | None = None,
) -> Stub:
    """Calls to ``shard`` of ``service`` (``stub.method.remote(*args)``): ``timeout`` per attempt,
    ``within`` seconds for all attempts; ``idempotent`` (the default: a shard's methods are meant
    to be pure, as inference is): a call that may have run is tried again elsewhere; ``hedge``
    (idempotent calls only): a call slower than twice the recent p95 also goes to a second
    provider, the first answer wins."""
    rt, _ = _service(node)
    # (the client side loads when first used; a starting node's shards service needs only keys)
    from lattica.shards._client import Stub

    return Stub(rt, service, shard, timeout=timeout, within=within, idempotent=idempotent, hedge=hedge)


def __getattr__(name: str) -> Any:  # PEP 562: ``Stub`` / ``StubMethod`` load on first use
    if name in ("Stub", "StubMethod"):
        from lattica.shards import _client as client  # (see ``stub()``)

        return getattr(client, name)
    raise AttributeError(f"module 'lattica.shards' has no attribute {name!r}")
