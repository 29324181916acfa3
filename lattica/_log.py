"""Lattica's loggers: structlog front end, stdlib ``logging`` back end.

Events go to the stdlib logger of the same name, so an application that configures nothing sees
only warnings (Python's default), and one that configures logging sees everything it asks for.
"""

from __future__ import annotations

import logging

import structlog

_PROCESSORS = [
    structlog.stdlib.filter_by_level,
    structlog.stdlib.PositionalArgumentsFormatter(),
    structlog.processors.format_exc_info,
    structlog.stdlib.render_to_log_kwargs,
]


def get_logger(name: str) -> structlog.stdlib.BoundLogger:
    return structlog.wrap_logger(
        logging.getLogger(name), processors=_PROCESSORS, wrapper_class=structlog.stdlib.BoundLogger
    )
