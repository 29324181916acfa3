"""Metrics in the Prometheus text format (version 0.0.4): a latency histogram cheap enough for the
call path, and the writer the dashboard's ``/metrics`` uses. Counters and gauges are read from
the node's own state when scraped, so nothing else is counted twice."""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterable, Sequence

__all__ = ["Histogram", "Family", "render", "LATENCY_BUCKETS"]

#: Seconds: 100 µs to 30 s, about three per decade.
LATENCY_BUCKETS = (
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
)


class Histogram:
    """Observations in fixed buckets (upper bounds, seconds), with their count and sum."""

    __slots__ = ("bounds", "counts", "total", "count")

    def __init__(self, bounds: Sequence[float] = LATENCY_BUCKETS) -> None:
        if list(bounds) != sorted(bounds) or not bounds:
            raise ValueError("histogram bounds must be a non-empty increasing sequence")
        self.bounds = tuple(bounds)
        self.counts = [0] * (len(self.bounds) + 1)  # the last: above every bound (+Inf)
        self.total = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.total += value
        self.count += 1


class Family:
    """One metric: name, type (counter, gauge, histogram), help, and its samples as
    ``(labels, value)`` (a histogram's value is a :class:`Histogram`)."""

    __slots__ = ("name", "kind", "help", "samples")

    def __init__(self, name: str, kind: str, help: str, samples: Iterable[tuple[dict[str, str], object]] = ()) -> None:
        self.name, self.kind, self.help = name, kind, help
        self.samples = list(samples)

    def add(self, value: object, **labels: str) -> Family:
        self.samples.append((labels, value))
        return self


def render(families: Iterable[Family]) -> str:
    """The text exposition of ``families``."""
    out: list[str] = []
    for f in families:
        out.append(f"# HELP {f.name} {_escape_help(f.help)}")
        out.append(f"# TYPE {f.name} {f.kind}")
        for labels, value in f.samples:
            if isinstance(value, Histogram):
                running = 0
                for bound, n in zip((*value.bounds, math.inf), value.counts):
                    running += n
                    out.append(f"{f.name}_bucket{_labels({**labels, 'le': _num(bound)})} {running}")
                out.append(f"{f.name}_sum{_labels(labels)} {_num(value.total)}")
                out.append(f"{f.name}_count{_labels(labels)} {value.count}")
            else:
                out.append(f"{f.name}{_labels(labels)} {_num(value)}")
    out.append("")
    return "\n".join(out)


def _num(v: object) -> str:
    if isinstance(v, bool):
        return "1" if v else "0"
    if isinstance(v, int):
        return str(v)
    x = float(v)  # type: ignore[arg-type]
    if math.isinf(x):
        return "+Inf" if x > 0 else "-Inf"
    if math.isnan(x):
        return "NaN"
    return repr(x)


def _labels(labels: dict[str, str]) -> str:
    if not labels:
        return ""
    return "{" + ",".join(f'{k}="{_escape(str(v))}"' for k, v in labels.items()) + "}"


def _escape(s: str) -> str:
    return s.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _escape_help(s: str) -> str:
    return s.replace("\\", "\\\\").replace("\n", "\\n")
