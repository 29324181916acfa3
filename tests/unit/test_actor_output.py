"""What an actor prints and logs is kept per actor (stdout, stderr, log records; bounded per actor
and per process; a record its handler prints is kept once), its last errors with tracebacks, its
end with why, and its utilisation series: all on one node, read the way the dashboard reads them."""

import logging
import sys
import time

import numpy as np
import pytest

import lattica
from lattica._node import Node
from lattica._runtime import output
from lattica._runtime.local import MAX_RECENT_ERRORS
from lattica._runtime.refs import ACTOR
from lattica.actors.dashboard.clean import clean_detail, clean_series
from lattica.actors.dashboard.report import actor_detail
from lattica.actors.dashboard.usage import ACTOR_FIELDS, NODE_FIELDS, SAMPLES, Usage

pytestmark = pytest.mark.timeout(60)


@lattica.actor
class Talker:
    def __init__(self, noisy=False):
        print("constructed")
        self.noisy = noisy

    def say(self, text, stream="stdout"):
        print(text, file=getattr(sys, stream))
        return len(text)

    def log(self, text):
        logging.getLogger("talker").warning("said %s", text)

    def half(self, text):
        sys.stdout.write(text)  # (no newline: the line is still being written)

    def fail(self, n):
        raise KeyError(f"no item {n}")

    async def async_say(self, text):
        print(text)
        return text

    def spin(self, seconds):
        end = time.process_time() + seconds
        while time.process_time() < end:
            pass


@lattica.actor
class WontStart:
    def __init__(self):
        print("trying", file=sys.stderr)
        raise RuntimeError("missing weights")

    def f(self):
        pass


@pytest.fixture(scope="module")
def node():
    with Node(["/ip4/127.0.0.1/tcp/0"]) as n:
        yield n


def _spawn(node, cls, *args):
    async def go():
        ref = cls.remote(*args)
        return ref

    return node.run(go(), timeout=10)


def _call(node, handle, *args):
    async def go():
        return await handle.remote(*args)

    return node.run(go(), timeout=10)


def _detail(node, name):
    rt = node.host.runtime
    return node.run(_on_loop(lambda: actor_detail(rt, name)), timeout=5)


async def _on_loop(fn):
    return fn()


def test_stdout_stderr_and_log_records_are_kept_per_actor_once_each(node):
    a, b = _spawn(node, Talker), _spawn(node, Talker)
    _call(node, a.say, "from a")
    _call(node, b.say, "from b", "stderr")
    _call(node, a.log, "hello")  # (no handler configured: Python's last resort prints it to stderr too)
    _call(node, a.async_say, "async a")
    _call(node, a.half, "partial")
    print("not an actor's")  # (outside every actor: nobody's ring)
    da, db = _detail(node, a.name), _detail(node, b.name)
    lines_a = [(s, t) for _, s, t in da["output"]]
    assert lines_a == [
        ("stdout", "constructed"),
        ("stdout", "from a"),
        ("log", "WARNING talker: said hello"),
        ("stdout", "async a"),
        ("stdout", "partial"),
    ], lines_a
    assert [(s, t) for _, s, t in db["output"]] == [("stdout", "constructed"), ("stderr", "from b")]


def test_an_actors_ring_is_bounded_in_lines_and_characters(node):
    a = _spawn(node, Talker)
    for i in range(output.MAX_LINES + 50):
        _call(node, a.say, f"line {i}")
    d = _detail(node, a.name)
    assert len(d["output"]) <= 200 and d["output"][-1][2] == f"line {output.MAX_LINES + 49}" and d["dropped"] >= 51
    _call(node, a.say, "x" * 100_000)
    d = _detail(node, a.name)
    ring = node.host.runtime.actors[a.name].output
    assert ring.size <= output.MAX_BYTES and all(len(t) <= output.MAX_LINE for _, _, t in d["output"])


def test_the_process_total_is_bounded_whatever_the_number_of_chatty_actors(node, monkeypatch):
    monkeypatch.setattr(output, "PROCESS_BYTES", 64 * 1024)
    actors = [_spawn(node, Talker) for _ in range(8)]
    for a in actors:
        for _ in range(40):
            _call(node, a.say, "y" * 900)
    assert output.held_bytes() <= 64 * 1024 + 8 * output.MAX_LINE, (
        output.held_bytes(),
        [r.size for r in output._rings.values()],
        sum(r.size for r in output._rings.values()),
    )  # (each ring keeps its share)


def test_the_last_errors_keep_their_tracebacks_without_the_runtimes_frames(node):
    a = _spawn(node, Talker)
    for i in range(MAX_RECENT_ERRORS + 3):
        with pytest.raises(KeyError):
            _call(node, a.fail, i)
    d = _detail(node, a.name)
    errs = d["recent_errors"]
    assert (
        len(errs) == MAX_RECENT_ERRORS
        and errs[-1]["message"] == f"'no item {MAX_RECENT_ERRORS + 2}'"
        and errs[-1]["method"] == "fail"
    )
    tb = errs[-1]["traceback"]
    assert 'raise KeyError(f"no item {n}")' in tb and "test_actor_output.py" in tb and "_runtime/local.py" not in tb
    assert d["errors"] == MAX_RECENT_ERRORS + 3


def test_an_actor_that_failed_to_start_leaves_why_and_what_it_printed(node):
    a = _spawn(node, WontStart)
    with pytest.raises(Exception):
        _call(node, a.f)
    d = _detail(node, a.name)
    assert d["state"] == "failed" and d["failure"][0] == "RuntimeError" and "missing weights" in d["failure"][2]
    assert d["reason"].startswith("failed to start") and [t for _, _, t in d["output"]] == ["trying"]
    assert [e["method"] for e in d["recent_errors"]] == ["__init__"]  # (once, however many calls waited for it)


def test_the_detail_survives_the_cleaning_a_members_detail_gets(node):
    a = _spawn(node, Talker)
    _call(node, a.say, "tab\there \x1b[31mred\x1b[0m")
    with pytest.raises(KeyError):
        _call(node, a.fail, 1)
    d = clean_detail(_detail(node, a.name))
    assert d["output"][-1][2] == "tab    here  [31mred [0m" and "\n" in d["recent_errors"][0]["traceback"]
    assert (
        clean_detail("x") is None and clean_detail({"output": [[1, "stdout"]], "recent_errors": "no"})["output"] == []
    )
    evil = {
        "output": [[1.0, "stdout\x1b", "a\x07b"]] * 10_000,
        "recent_errors": [{"traceback": "t" * 10**6}] * 100,
        "series": {"time": [1, 2], "calls": [1]},
    }
    d = clean_detail(evil)
    assert (
        len(d["output"]) == 200
        and d["output"][0][1:] == ["stdout ", "a b"]
        and len(d["recent_errors"]) == MAX_RECENT_ERRORS
    )
    assert len(d["recent_errors"][0]["traceback"]) <= 4000 and d["series"] is None  # (a column shorter than its times)


def test_usage_samples_the_node_and_each_actor_in_fixed_rings(node):
    rt = node.host.runtime
    usage = Usage(rt)
    a = _spawn(node, Talker)
    _call(node, a.say, "up")  # (its thread runs: its CPU can be read from the first sample)

    async def take():
        usage._sample()

    node.run(take(), timeout=5)  # (the baseline)
    for _ in range(5):
        _call(node, a.say, "z")
    _call(node, a.spin, 0.2)
    with pytest.raises(KeyError):
        _call(node, a.fail, 0)
    node.run(take(), timeout=5)
    s = usage.actor_series(a.name)
    assert s["calls"][-1] > 0 and s["errors"][-1] > 0 and s["cpu"][-1] > 0 and len(s["time"]) == 1
    n = usage.node_series()
    assert set(NODE_FIELDS) <= set(n) and n["memory"][-1] > 10 * 2**20 and n["calls"][-1] > 0
    for _ in range(SAMPLES + 5):
        node.run(take(), timeout=5)
    assert len(usage.node_series()["time"]) == SAMPLES and len(usage.actor_series(a.name)["calls"]) == SAMPLES
    assert (
        clean_series(usage.node_series(), NODE_FIELDS) is not None
        and clean_series(usage.actor_series(a.name), ACTOR_FIELDS) is not None
    )
    assert usage.actor_series("nobody") is None


class _Noisy:
    """A cycle whose finalizer prints: the garbage collector runs it at any allocation, also
    while the output lock is held."""

    def __init__(self):
        self.me = self

    def __del__(self):
        print("closing a resource")


@lattica.actor
class Churner:
    def work(self, n):
        import gc

        gc.set_threshold(50)
        try:
            for i in range(n):
                _Noisy()
                print(f"step {i}")
        finally:
            gc.set_threshold(700, 10, 10)
        return n

    def log_then_print(self):
        log = logging.getLogger("quiet")
        log.addHandler(logging.NullHandler())
        log.propagate = False
        log.warning("%d", 1)
        print("epoch 1 loss=0.11 done")
        log.warning("ok")
        print("tokens: 10 ok")

    def log_unprintable(self):
        class Bad:
            def __str__(self):
                raise ValueError("no str")

            __repr__ = __str__

        log = logging.getLogger("bad")
        log.addHandler(logging.NullHandler())  # (pytest's own handler re-raises what it cannot format)
        log.propagate = False
        log.warning(Bad())
        return "went on"


def test_a_finalizer_that_prints_while_output_is_noted_does_not_deadlock(node):
    a = _spawn(node, Churner)
    assert _call(node, a.work, 3000) == 3000  # (it hung for good before)
    assert any(t == "step 2999" for _, _, t in _detail(node, a.name)["output"])


def test_only_a_handlers_own_copy_of_a_record_is_left_out(node):
    a = _spawn(node, Churner)
    _call(node, a.log_then_print)
    lines = [(s, t) for _, s, t in _detail(node, a.name)["output"]]
    assert ("stdout", "epoch 1 loss=0.11 done") in lines and ("stdout", "tokens: 10 ok") in lines, lines


def test_a_record_that_cannot_be_formatted_does_not_break_the_call(node):
    a = _spawn(node, Churner)
    assert _call(node, a.log_unprintable) == "went on"
    assert ("log", "WARNING bad: (a message that could not be formatted)") in [
        (s, t) for _, s, t in _detail(node, a.name)["output"]
    ]


def test_a_new_actor_under_an_old_name_gets_none_of_the_old_ones_output(node):
    rt = node.host.runtime

    async def make():
        return rt.create(Talker.cls, [], None, "reused").ref

    async def stop():
        await rt.actors["reused"].stop("test")

    old = node.run(make(), timeout=5)
    old_ring = rt.actors["reused"].output
    node.run(stop(), timeout=5)
    new = node.run(make(), timeout=5)
    old_ring_before = list(old_ring.lines)
    token = ACTOR.set(old)  # (as in a task the old incarnation left behind)
    try:
        print("from the old incarnation")
    finally:
        ACTOR.reset(token)
    deadline = time.monotonic() + 5
    while not _detail(node, "reused")["output"] and time.monotonic() < deadline:  # (its constructor runs on its thread)
        time.sleep(0.02)
    assert [t for _, _, t in _detail(node, "reused")["output"]] == ["constructed"]
    assert list(old_ring.lines) == old_ring_before and new is not old


def test_one_huge_write_keeps_its_last_lines_and_counts_the_rest(node):
    a = _spawn(node, Talker)
    _call(node, a.say, "\n".join(f"l{i}" for i in range(100_000)))
    d = _detail(node, a.name)
    assert d["output"][-1][2] == "l99999" and len(d["output"]) <= output.MAX_LINES and d["dropped"] >= 99_800


def test_what_an_actor_holds_is_estimated_on_demand_and_charted_from_then_on(node):
    from lattica.actors.dashboard.footprint import MAX_OBJECTS, footprint

    class Model:
        def __init__(self):
            self.w = np.zeros((1000, 1000))  # 8 MB
            self.view = self.w[:10]  # (a view: nothing more)
            self.again = [self.w, self.w]  # (the same array: counted once)
            self.me = self  # (a cycle)

    got = footprint(Model())
    assert 8_000_000 <= got["bytes"] < 8_100_000 and got["complete"]
    many = footprint([[i] for i in range(MAX_OBJECTS * 2)])
    assert not many["complete"] and many["objects"] == MAX_OBJECTS  # (bounded: a few ms on the loop)

    rt = node.host.runtime
    usage = Usage(rt)
    a = _spawn(node, Talker)
    _call(node, a.say, "up")

    async def take():
        usage._sample()

    node.run(take(), timeout=5)
    node.run(take(), timeout=5)
    assert usage.actor_series(a.name)["memory"][-1] == -1  # (not measured while nobody looks)
    d = node.run(_on_loop(lambda: actor_detail(rt, a.name, usage)), timeout=5)
    assert d["memory"]["bytes"] > 0 and clean_detail(d)["memory"]["bytes"] == d["memory"]["bytes"]
    node.run(take(), timeout=5)
    assert usage.actor_series(a.name)["memory"][-1] == d["memory"]["bytes"]
