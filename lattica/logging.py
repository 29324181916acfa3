"""Opt-in logging setup. Lattica never configures logging at import; call :func:`configure` from an
application (the CLI does) to see its structured logs on stderr."""

from __future__ import annotations

import logging
import sys

import structlog


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
