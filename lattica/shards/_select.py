"""Which provider of a shard a stub calls, sans-IO: power of two choices over load and measured
latency, and bans with backoff for providers that failed.

Each provider's score is ``(calls we have in flight to it + the load it registered + 1) x its
latency`` (an average of what calls to it took; one never measured counts as fast as the fastest
known, so it gets tried). A pick samples two providers that are not banned and takes the lower
score: nearly as good as asking all, without every stub herding onto the one that looked best
(Mitzenmacher's two choices, as Ray Serve and Finagle route). A failure bans a provider for 1 s,
doubling with each failure in a row up to 30 s; a success ends that.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from lattica._runtime.refs import ActorRef

__all__ = ["Picker", "Provider", "BAN_FIRST", "BAN_MAX"]

BAN_FIRST = 1.0  # s a provider is left alone after a failure (doubling with each one in a row)
BAN_MAX = 30.0
LATENCY_WEIGHT = 0.3  # of a new measurement in the average
DEFAULT_LATENCY = 0.005  # s, for a provider when none has been measured


@dataclass(eq=False)
class Provider:
    """One actor serving the shard, and what this stub knows of it."""

    ref: ActorRef
    load: int = 0  # as its node registered it
    latency: float | None = None  # average seconds per call, as measured here
    inflight: int = 0
    failures: int = 0  # in a row
    banned_until: float = 0.0
    reasons: list[str] = field(default_factory=list)  # the last failures, for error messages

    def __repr__(self) -> str:
        return f"Provider({self.ref.peer_id.short()}/{self.ref.name}, load={self.load}, latency={self.latency}, inflight={self.inflight})"


class Picker:
    """The providers of one shard as this stub knows them (see the module docstring)."""

    def __init__(self, rng: random.Random | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        self._rng = rng or random.Random()
        self._clock = clock
        self.providers: dict[tuple, Provider] = {}

    def update(self, entries: Iterable[tuple[ActorRef, int]]) -> None:
        """What the DHT says now: new providers join, gone ones leave (what we learned of the
        others stays: their latency, their bans)."""
        seen = {}
        for ref, load in entries:
            key = (ref.peer_id, ref.name)
            p = self.providers.get(key) or Provider(ref)
            p.load = load
            seen[key] = p
        self.providers = seen

    def available(self, exclude: Iterable[Provider] = ()) -> list[Provider]:
        now = self._clock()
        skip = {id(p) for p in exclude}
        return [p for p in self.providers.values() if p.banned_until <= now and id(p) not in skip]

    def pick(self, exclude: Iterable[Provider] = ()) -> Provider | None:
        """The provider to call next (not one of ``exclude``), or None if none is available."""
        ready = self.available(exclude)
        if len(ready) <= 1:
            return ready[0] if ready else None
        a, b = self._rng.sample(ready, 2)
        known = [p.latency for p in self.providers.values() if p.latency is not None]
        fastest = min(known) if known else DEFAULT_LATENCY
        return a if self._score(a, fastest) <= self._score(b, fastest) else b

    @staticmethod
    def _score(p: Provider, fastest: float) -> float:
        return (p.inflight + p.load + 1) * (p.latency if p.latency is not None else fastest)

    def next_ready(self) -> float | None:
        """When the first banned provider may be tried again (None if there are none)."""
        return min((p.banned_until for p in self.providers.values()), default=None)

    def started(self, p: Provider) -> None:
        p.inflight += 1

    def succeeded(self, p: Provider, seconds: float) -> None:
        p.inflight = max(0, p.inflight - 1)
        p.latency = seconds if p.latency is None else (1 - LATENCY_WEIGHT) * p.latency + LATENCY_WEIGHT * seconds
        p.failures = 0
        p.banned_until = 0.0

    def cancelled(self, p: Provider, seconds: float) -> None:
        """A call to ``p`` was given up after ``seconds`` (another provider answered first): not
        a failure, but it took at least that long, and its average says so (a provider that went
        silent loses every pick it shares with one that answers)."""
        p.inflight = max(0, p.inflight - 1)
        if p.latency is None or p.latency < seconds:
            p.latency = seconds if p.latency is None else (1 - LATENCY_WEIGHT) * p.latency + LATENCY_WEIGHT * seconds

    def failed(self, p: Provider, reason: str, ban: float | None = None) -> None:
        """A call to ``p`` failed (``reason``): it is left alone for a while (``ban`` seconds,
        else by the backoff)."""
        p.inflight = max(0, p.inflight - 1)
        p.failures += 1
        p.reasons = (p.reasons + [reason])[-3:]
        wait = ban if ban is not None else min(BAN_FIRST * 2 ** (p.failures - 1), BAN_MAX)
        p.banned_until = self._clock() + wait
