"""Lattica's loggers: events reach the stdlib logger of their module with their key-value
context, events below its level are dropped before structlog runs, exceptions keep their
traceback."""

from __future__ import annotations

import logging

from lattica.logging import get_logger


def test_events_reach_the_stdlib_logger_with_their_context(caplog):
    caplog.set_level(logging.INFO, logger="lattica.test_logging")
    log = get_logger("lattica.test_logging")
    log.info("peer connected", peer="abc", n=3)
    log.debug("not shown")
    (record,) = [r for r in caplog.records if r.name == "lattica.test_logging"]
    assert record.levelno == logging.INFO
    assert record.getMessage() == "peer connected"
    assert (record.peer, record.n) == ("abc", 3)


def test_events_below_the_level_cost_no_structlog_pass(caplog):
    caplog.set_level(logging.WARNING, logger="lattica.test_logging.quiet")
    log = get_logger("lattica.test_logging.quiet")
    log.debug("dropped", a=1)
    log.info("dropped", a=2)
    assert log._bound is None  # structlog's logger was never built
    assert not [r for r in caplog.records if r.name == "lattica.test_logging.quiet"]
    log.warning("shown", a=3)
    assert log._bound is not None
    assert [r.a for r in caplog.records if r.name == "lattica.test_logging.quiet"] == [3]


def test_exception_keeps_the_traceback(caplog):
    caplog.set_level(logging.ERROR, logger="lattica.test_logging.exc")
    log = get_logger("lattica.test_logging.exc")
    try:
        raise ZeroDivisionError("boom")
    except ZeroDivisionError:
        log.exception("handler failed", handler="x")
    (record,) = [r for r in caplog.records if r.name == "lattica.test_logging.exc"]
    assert record.levelno == logging.ERROR and record.handler == "x"
    assert record.exc_info is not None and record.exc_info[0] is ZeroDivisionError


def test_bound_context_is_carried():
    log = get_logger("lattica.test_logging.bound").bind(actor="a1")
    assert log._context == {"actor": "a1"}
