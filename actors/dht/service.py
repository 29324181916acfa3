""":class:`DhtService`, one node's DHT as the rest of Lattica reaches it (``runtime.dht``): the
state, lookups and upkeep layers in one object, started."""

from __future__ import annotations

from typing import TYPE_CHECKING

from lattica.actors.dht.upkeep import DhtUpkeep
from lattica.config import DhtConfig
from lattica.errors import LatticaError
from lattica.logging import get_logger

if TYPE_CHECKING:
    from lattica._runtime.calls import Calls

log = get_logger("lattica.dht")


class DhtService(DhtUpkeep):
    """One node's DHT: routing table, record store, lookups and the background upkeep.

    Local code reaches it as ``NodeServices.dht``; peers reach only :class:`DhtActor`, which answers
    from its state and never makes this node run a lookup or a put on their behalf."""

    def __init__(self, runtime: Calls, config: DhtConfig | None = None) -> None:
        super().__init__(runtime, config)
        self.host.events.identified.subscribe(self.on_identified)
        self.host.events.membership_changed.subscribe(self.on_membership)
        self.host.events.addresses_changed.subscribe(lambda addrs: self.host.spawn(self._announce_addresses()))
        self.host.spawn(self.upkeep_loop())

    async def _announce_addresses(self) -> None:
        """Our addresses changed (a relay reservation, AutoNAT's verdict): re-sign our peer record
        at once, so peers dialing us by PeerId find the new ones."""
        try:
            if len(self.table):
                await self.publish_peer_record()
        except LatticaError as e:
            log.info("publishing our new addresses failed", reason=str(e))
