"""Lattica's loggers: a structlog front end (:func:`get_logger`) over stdlib ``logging``.

Events go to the stdlib logger of the same name, so an application that configures nothing sees
only warnings (Python's default) and one that configures logging sees everything it asks for.
Lattica never configures logging at import; :func:`configure` is the opt-in setup an application
(or the CLI) calls to see the structured logs on stderr."""

from __future__ import annotations

import logging
import sys

import structlog

_PROCESSORS = [
    structlog.stdlib.filter_by_level,
    structlog.stdlib.PositionalArgumentsFormatter(),
    structlog.processors.format_exc_info,
    structlog.stdlib.render_to_log_kwargs,
]


def get_logger(name: str) -> structlog.stdlib.BoundLogger:
    """The structlog logger of one Lattica module, writing to the stdlib logger ``name``."""
    return structlog.wrap_logger(
        logging.getLogger(name), processors=_PROCESSORS, wrapper_class=structlog.stdlib.BoundLogger
    )


def configure(level: str | int = "INFO", json: bool = False) -> None:
    """Show Lattica's log events (with their key-value context) on stderr at ``level``."""
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
