"""A minimal system service, the one docs/architecture.md ("Adding a service") walks through: the
service (what the node keeps), its actor (what peers call) and its builder (how the node makes it
from its context and the services above it). One row in ``lattica/services.py`` turns it on:

    greeter: Greeter = _row(build_greeter, public=frozenset({"hello"}))

The tests import this file and add that row (tests/integration/test_services.py)."""

from __future__ import annotations

from lattica.actors.dht import DhtService
from lattica.services import Built, Calls, NodeServices, ServiceContext


class Greeter:
    """The service: it counts the greetings it served, and finds greeters by name in the DHT."""

    def __init__(self, runtime: Calls, dht: DhtService) -> None:
        self.peer_id = runtime.peer_id
        self.dht = dht  # a service it uses: handed to it, never looked up
        self.served = 0
        self.closed = False

    def close(self) -> None:
        """The node stops (services close in reverse start order, after their actors stopped)."""
        self.closed = True


class GreeterActor:
    """What peers call as ``greeter.hello(who)``: members all, strangers only what the row opens."""

    NAME = "greeter"

    def __init__(self, service: Greeter) -> None:
        self._service = service

    async def hello(self, who: str) -> str:
        self._service.served += 1
        return f"hello {who} from {self._service.peer_id.short()}"


def build_greeter(ctx: ServiceContext, services: NodeServices) -> Built | None:
    """The row's builder: None turns the service off (a configuration that does not want it)."""
    service = Greeter(ctx.runtime, services.dht)
    return Built(service, GreeterActor(service))
