"""Checks on a peer's bundle before the router forwards it (the pub-sub service's,
``lattica.actors.pubsub``): the author's Ed25519 signature (once per bundle); a seqno, which is
the author's clock in ns, within ``clock_skew``; an author of our mesh (on a topic not opened to
strangers); the author's rate; items the codec can decode; then the topic's validator on each
item, whose answers become the verdicts (``accept``, ``reject`` or ``ignore``). A libp2p
GossipSub message (its StrictSign signature checked before the router took it) is checked the
same way but for the clock (libp2p seqnos are counters, or random in js) and the codec (its data
is the author's bytes). Loaded with the router, at first use."""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from lattica import codec
from lattica._budget import Buckets
from lattica._identity import PeerId, verify_signature
from lattica.errors import LatticaError
from lattica.logging import get_logger
from lattica.pubsub._libp2p import Signed
from lattica.pubsub._router import ACCEPT, IGNORE, REJECT
from lattica.pubsub._subscription import Message

if TYPE_CHECKING:
    from lattica._hostview import HostView
    from lattica.actors.pubsub.bundle import Bundle
    from lattica.config import PubSubConfig
    from lattica.pubsub._router import Envelope

log = get_logger("lattica.pubsub")

__all__ = ["Checks"]

_VERDICTS = {True: ACCEPT, False: REJECT, None: IGNORE, ACCEPT: ACCEPT, REJECT: REJECT, IGNORE: IGNORE}
_AUTHORS_MAX = 4096  # authors whose public keys (and memberships, and rates) we keep


class Checks:
    """A node's checks on peers' bundles (see the module docstring). ``validators``: the
    service's, topic -> the application's check; ``payloads``: the service's, message id ->
    ([(item, decoded data)], peer it came from) until delivered; ``is_open`` tells the topics
    opened to strangers (whose authors need not be members)."""

    def __init__(
        self,
        host: HostView,
        cfg: PubSubConfig,
        validators: dict[str, Callable[[Message], Any]],
        payloads: dict[bytes, tuple[list, Any]],
        is_open: Callable[[str], bool],
        clock: Callable[[], float],
    ) -> None:
        self.host = host
        self.cfg = cfg
        self._validators = validators
        self._payloads = payloads
        self._is_open = is_open
        # bundles from each author we check (the service's own pace is half that)
        self._rates = Buckets(cfg.author_rate, max(cfg.author_rate, 1.0), _AUTHORS_MAX, clock=clock)
        self._keys: dict[bytes, bytes | None] = {}
        self._members: dict[bytes, float] = {}  # authors known to be members: until when (their certificate's expiry)

    def check(self, env: Envelope, peer: Any) -> Any:
        """REJECT, or each item's verdict: a list, holding awaitables where an async validator
        is still at work."""
        b: Bundle | Signed = env.data
        if isinstance(b, Signed):
            certs: Any = ()
        else:
            key = self._key(env.author)
            if key is None or not verify_signature(
                key, env.signature, b.signed_bytes(env.topic, env.author, env.seqno)
            ):
                return REJECT
            if abs(env.seqno / 1e9 - time.time()) > self.cfg.clock_skew:
                return REJECT  # a replay from beyond the seen cache, or a clock far off
            certs = b.certs
        if not self._is_open(env.topic) and not self._is_member(env.author, certs):
            return IGNORE  # an author outside the mesh (not the sender's doing: it may know the author better)
        if not self._rates.take(env.author):
            # (the author's doing, not the sender's): no author can push the seen cache's
            # 100,000 entries out within the clock window (and so replay its old messages)
            return IGNORE
        if isinstance(b, Signed):
            items: list = [(0, b.msg.data)]
        else:
            try:
                items = [(i, codec.decode(d)) for i, d in enumerate(b.items)]
            except LatticaError:
                return REJECT
        self._payloads[env.id] = (items, peer)
        fn = self._validators.get(env.topic)
        if fn is None:
            return [ACCEPT] * len(items)
        author = PeerId.from_bytes(env.author)
        verdicts: list = []
        for i, data in items:
            try:
                out = fn(Message(env.topic, author, env.seqno + i, data, peer))
            except Exception:
                log.exception("pub-sub validator failed", topic=env.topic)
                out = IGNORE
            verdicts.append(out if inspect.isawaitable(out) else _verdict_of(out))
        return verdicts

    async def settle(self, topic: str, pending: list) -> list[str] | str:
        """The verdicts of a bundle's items, some still being worked out by an async validator
        (IGNORE when it fails, or takes longer than ``validate_timeout``)."""
        try:
            return await asyncio.wait_for(_gather_verdicts(pending, topic), self.cfg.validate_timeout)
        except TimeoutError:
            log.info("pub-sub validator timed out", topic=topic, seconds=self.cfg.validate_timeout)
            return IGNORE
        except Exception:
            log.exception("pub-sub validator failed", topic=topic)
            return IGNORE

    def abandon(self, verdicts: list) -> None:
        """Verdicts no longer waited for: their coroutines are closed (never awaited: no warning)."""
        for v in verdicts:
            close = getattr(v, "close", None)
            if close is not None:
                close()

    def _is_member(self, author: bytes, certs: Any) -> bool:
        """Whether ``author`` belongs to our mesh, by its certificates (as in identify) or its
        PeerId: a mesh's topics carry only its members' messages."""
        until = self._members.get(author)
        if until is not None and until > time.time():
            return True
        trust = self.host.trust
        if trust.open:
            return True
        try:
            verdict = trust.judge(PeerId.from_bytes(author), list(certs), time.time())
        except LatticaError:
            return False
        if verdict.circle == "stranger":
            return False
        if len(self._members) >= _AUTHORS_MAX:
            self._members.pop(next(iter(self._members)))
        self._members[author] = verdict.until
        return True

    def _key(self, author: bytes) -> Any:
        """The author's public key (decoded once), or None if its PeerId holds none."""
        if author in self._keys:
            return self._keys[author]
        try:
            key = PeerId.from_bytes(author).public_key()
        except LatticaError:
            key = None
        if len(self._keys) >= _AUTHORS_MAX:
            self._keys.pop(next(iter(self._keys)))
        self._keys[author] = key
        return key


async def _gather_verdicts(pending: list, topic: str) -> list[str]:
    """The verdicts of a bundle's items, some still being worked out by an async validator."""
    outs = iter(await asyncio.gather(*(v for v in pending if inspect.isawaitable(v)), return_exceptions=True))
    verdicts = []
    for v in pending:
        if inspect.isawaitable(v):
            out = next(outs)
            if isinstance(out, Exception):
                log.error("pub-sub validator failed", topic=topic, error=repr(out))
            v = _verdict_of(out)
        verdicts.append(v)
    return verdicts


def _verdict_of(out: Any) -> str:
    """A validator's answer as a verdict: anything it should not have said is "ignore"."""
    try:
        return _VERDICTS.get(out, IGNORE)
    except TypeError:  # (unhashable)
        return IGNORE
