"""Opt-in logging setup. Lattica logs through structlog and never configures logging at import;
call :func:`configure` from an application (or the CLI) to see its logs."""

from __future__ import annotations

import logging
import sys

import structlog


def configure(level: str | int = "INFO", json: bool = False) -> None:
    """Route structlog (and the stdlib ``lattica`` loggers) to stderr at ``level``."""
    lvl = logging.getLevelName(level.upper()) if isinstance(level, str) else level
    renderer = structlog.processors.JSONRenderer() if json else structlog.dev.ConsoleRenderer(colors=False)
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso"),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(lvl),
        logger_factory=structlog.PrintLoggerFactory(sys.stderr),
        cache_logger_on_first_use=True,
    )
