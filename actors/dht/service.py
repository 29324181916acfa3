""":class:`DhtService`, one node's DHT as the rest of Lattica reaches it (``runtime.dht``): the
state, lookups and upkeep layers in one object, started."""

from __future__ import annotations

from typing import TYPE_CHECKING

from lattica.actors.dht.upkeep import DhtUpkeep
from lattica.config import DhtConfig

if TYPE_CHECKING:
    from lattica.runtime import Runtime


class DhtService(DhtUpkeep):
    """One node's DHT: routing table, record store, lookups and the background upkeep.

    Local code reaches it as ``runtime.dht``; peers reach only :class:`DhtActor`, which answers
    from its state and never makes this node run a lookup or a put on their behalf."""

    def __init__(self, runtime: Runtime, config: DhtConfig | None = None) -> None:
        super().__init__(runtime, config)
        self.host.identify_listeners.append(self.on_identified)
        self.host.spawn(self.upkeep_loop())
