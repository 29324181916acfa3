"""Code that travels: a driver's source files go with the actors it spawns on other nodes.

``package``: the deterministic package of source files; ``tickets``: its signed name, and which
modules travel under which; ``script``: which of a driver script's statements other nodes run;
``loader``: packages imported in namespaces of their own; ``shipper``: the driver's side (what
travels); ``library``: the node's side (whose code it runs, what it has loaded). Source only:
nothing is ever unpickled (docs/api.md, "Code that travels"). The parser, packer and loader load
with the first package a node makes or runs.
"""

from lattica._code.library import ACCEPT, CodeLibrary
from lattica._code.shipper import Shipper
from lattica._code.tickets import NAMESPACE_PREFIX, Ticket, known_ticket, ticket_of

__all__ = ["ACCEPT", "CodeLibrary", "NAMESPACE_PREFIX", "Shipper", "Ticket", "known_ticket", "ticket_of"]
