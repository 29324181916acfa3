"""Fixtures several call tests share (tests/support/call_fixtures.py), found by pytest by name."""

from call_fixtures import node, where  # noqa: F401 -- fixtures
