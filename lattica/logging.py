"""Lattica's loggers: a structlog front end (:func:`get_logger`) over stdlib ``logging``.

Events go to the stdlib logger of the same name, so an application that configures nothing sees
only warnings (Python's default) and one that configures logging sees everything it asks for.
Lattica never configures logging at import; :func:`configure` is the opt-in setup an application
(or the CLI) calls to see the structured logs on stderr.

structlog is imported on the first event a logger lets through, not at import: a starting node
that logs nothing does not pay for it, and an event below the stdlib logger's level costs one
level check instead of a pass through structlog's processors."""

from __future__ import annotations

import logging
import sys
from typing import Any

__all__ = ["Logger", "get_logger", "configure"]

_DEBUG, _INFO, _WARNING, _ERROR, _CRITICAL = (
    logging.DEBUG,
    logging.INFO,
    logging.WARNING,
    logging.ERROR,
    logging.CRITICAL,
)


class Logger:
    """One Lattica module's logger: ``log.info("event", key=value)``, as structlog's stdlib
    ``BoundLogger`` (which it builds on the first event that passes the level check)."""

    __slots__ = ("_std", "_bound")

    def __init__(self, name: str) -> None:
        self._std = logging.getLogger(name)
        self._bound: Any = None

    def _structlog(self) -> Any:
        if self._bound is None:
            import structlog  # on the first event let through (see the module docstring)

            self._bound = structlog.wrap_logger(
                self._std,
                processors=[
                    structlog.stdlib.filter_by_level,
                    structlog.stdlib.PositionalArgumentsFormatter(),
                    structlog.processors.format_exc_info,
                    structlog.stdlib.render_to_log_kwargs,
                ],
                wrapper_class=structlog.stdlib.BoundLogger,
            )
        return self._bound

    def debug(self, event: str, *args: Any, **kw: Any) -> None:
        if self._std.isEnabledFor(_DEBUG):
            self._structlog().debug(event, *args, **kw)

    def info(self, event: str, *args: Any, **kw: Any) -> None:
        if self._std.isEnabledFor(_INFO):
            self._structlog().info(event, *args, **kw)

    def warning(self, event: str, *args: Any, **kw: Any) -> None:
        if self._std.isEnabledFor(_WARNING):
            self._structlog().warning(event, *args, **kw)

    def error(self, event: str, *args: Any, **kw: Any) -> None:
        if self._std.isEnabledFor(_ERROR):
            self._structlog().error(event, *args, **kw)

    def exception(self, event: str, *args: Any, **kw: Any) -> None:
        """An error event with the exception being handled (call it inside ``except``)."""
        if self._std.isEnabledFor(_ERROR):
            self._structlog().exception(event, *args, **kw)

    def critical(self, event: str, *args: Any, **kw: Any) -> None:
        if self._std.isEnabledFor(_CRITICAL):
            self._structlog().critical(event, *args, **kw)

    def bind(self, **kw: Any) -> Any:
        """A structlog logger carrying ``kw`` on every event."""
        return self._structlog().bind(**kw)


def get_logger(name: str) -> Logger:
    """The logger of one Lattica module, writing to the stdlib logger ``name``."""
    return Logger(name)


def configure(level: str | int = "INFO", json: bool = False) -> None:
    """Show Lattica's log events (with their key-value context) on stderr at ``level``."""
    import structlog  # only a node that shows its logs needs it

    renderer = structlog.processors.JSONRenderer() if json else structlog.dev.ConsoleRenderer(colors=False)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            processors=[
                structlog.stdlib.add_log_level,
                structlog.stdlib.add_logger_name,  # needs the record: before the meta keys go
                structlog.stdlib.ProcessorFormatter.remove_processors_meta,
                structlog.processors.TimeStamper(fmt="iso"),
                renderer,
            ],
            foreign_pre_chain=[structlog.stdlib.ExtraAdder()],
        )
    )
    root = logging.getLogger("lattica")
    for h in list(root.handlers):
        if getattr(h, "_lattica", False):
            root.removeHandler(h)
    handler._lattica = True  # type: ignore[attr-defined]
    root.addHandler(handler)
    root.setLevel(level.upper() if isinstance(level, str) else level)
    root.propagate = False
