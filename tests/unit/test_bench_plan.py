"""Every ``lattica bench NAME`` says what it will run and about how long before it runs: one table
(lattica.bench.plan.PLANS) for all (issue 45)."""

import io

from lattica.bench import plan
from lattica.cli import parser


def _benches() -> list[str]:
    bench = next(a for a in parser()._subparsers._group_actions[0].choices["bench"]._actions if a.dest == "which")
    return list(bench.choices)


def _announced(*argv: str) -> str:
    args = parser().parse_args(["bench", *argv])
    got = plan.plan_of(args.which, args)
    assert got is not None, f"bench {args.which} has no plan"
    out = io.StringIO()
    plan.announce(args.which, got, out)
    return out.getvalue()


def test_every_bench_says_what_it_runs_and_about_how_long():
    names = _benches()
    assert set(names) - {"all"} == set(plan.PLANS)
    for name in names:
        line = _announced(name)
        assert line.startswith(f"lattica bench {name}: ") and line.count("\n") == 1, line
        what, about = line.split(": ", 1)[1].rsplit(", about ", 1)
        assert what and (about.split()[1] in ("s", "min")) and float(about.split()[0]) > 0, line


def test_the_estimates_follow_the_arguments():
    assert "1 configuration of 10 s, about 12 s (--matrix:" in _announced("rpc")
    assert _announced("rpc", "--matrix").startswith("lattica bench rpc: 32 configurations of 10 s, about 6 min")
    assert "about 7 min" in _announced("soak", "--soak-seconds", "400")
    assert "4 streams" in _announced("stream") and "2 streams" in _announced("stream", "--transport", "tcp")
    assert "30 partitioned runs of 20 replicas" in _announced("crdt-sim", "--runs", "30")
    every = plan.plan_of("all", parser().parse_args(["bench", "all"]))
    assert every.seconds == sum(
        plan.plan_of(n, parser().parse_args(["bench", n])).seconds for n in plan.IN_ALL if n in plan.PLANS
    )
