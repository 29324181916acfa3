"""The content plane across NATs: a fresh process gets by CID from a provider behind each NAT.

What a user does: two public relay/bootstrap nodes stay up; for each of the six NAT kinds a fresh
provider process (``contentpeer.py provider``) on a fresh site of that kind puts 4 MiB of seeded
random bytes (the test knows their sha256) and waits until its reachability settles (public, or
relay reservations); then fresh fetcher processes, which know only the bootstrap addresses and
the CID, call ``lattica.content.get`` one after the other: one on a fresh public host and one
behind another NAT kind (NAT_FETCHER). Every node has its own blockstore directory; every process
is killed with SIGKILL when its part is done (the bootstrap nodes see the churn, as in
test_coldstart). The test asserts that every get returned the provider's bytes and prints a
table: seconds of the get and MB/s, seconds from the fetcher's start to ``lattica.init``
returning, to the first bytes and to the first bytes over a direct path, and the path to the
provider while bytes came in (``relay``; ``tcp``/``quic``: direct, hole-punched when both are
behind NATs; ``relay>quic``: the hole punch finished during the get).

The default run (~1 min) gets from each kind with the pairs in NAT_FETCHER (symmetric ->
symmetric is the pair whose data stays relayed: both ports are unpredictable). ``--slow`` adds
the whole matrix (a fetcher behind every kind for a provider behind every kind, ~2 min more).
The re-seed case (a new provider of an object whose earlier providers went away) runs by default:
the dead providers' records must not hold the fetch up.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import random
import signal
import sys
import time

import pytest

from .lab import Lab, TwoRelays
from .test_matrix import KINDS6, SHORT, Proc

CONTENTPEER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "contentpeer.py")
SIZE = 4 << 20  # 4 chunks of 1 MiB and the root
# the fetcher behind a NAT for each provider kind in the default run: every kind once as a
# provider, every NAT kind at least once as a fetcher, and one pair that stays relayed
NAT_FETCHER = {
    "public": "symmetric",
    "full_cone": "address_restricted",
    "address_restricted": "port_restricted",
    "port_restricted": "firewall",
    "symmetric": "symmetric",  # no hole punch between two symmetric NATs: the data goes relayed
    "firewall": "full_cone",
}
# the re-seed case (slow): providers behind these kinds put the same bytes one after the other,
# each staying until it holds relay reservations, then going away (their provider records stay
# behind); then a new provider behind the last kind puts them, and a fresh public fetcher gets them
RESEED = (("port_restricted", "full_cone", "address_restricted", "symmetric"), "firewall")
RESULTS: dict[tuple[str, str], dict] = {}


pytestmark = pytest.mark.usefixtures("need_lab")  # (tests/natlab/conftest.py)


@contextlib.contextmanager
def _env(**values: str):
    """Environment variables for the processes started inside (Proc copies os.environ)."""
    old = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _kill(proc: Proc) -> None:
    if proc.p.poll() is None:
        proc.p.send_signal(signal.SIGKILL)
    proc.p.wait(10)


def _expected(seed: int) -> str:
    return hashlib.sha256(random.Random(seed).randbytes(SIZE)).hexdigest()


def _slow(config) -> bool:
    return bool(config.getoption("--slow", default=False)) or os.environ.get("LATTICA_SLOW") == "1"


@pytest.fixture(scope="module")
def contentlab(request, tmp_path_factory):
    """The lab, its two bootstrap relays and every site the tests use: all built before any node
    starts. (Adding a port to the internet bridge can change the bridge's MAC address, which is
    the gateway's for the routed firewall subnets; a node that cached the old one loses its
    packets to firewall hosts until its ARP entry expires. Building first sidesteps that.)"""
    with Lab(prefix="nlct") as lab:
        relays = TwoRelays(lab)
        sites = {}
        for kind in KINDS6:
            sites[("provider", kind)] = lab.add_site(kind)
            sites[("fetcher", kind)] = lab.add_site(NAT_FETCHER[kind])
            # a public fetcher at an address no earlier node had (a fresh machine)
            sites[("public", kind)] = lab.public_host(f"fetch{KINDS6.index(kind)}")
        if _slow(request.config):
            for kind in KINDS6:
                sites[("provider*", kind)] = lab.add_site(kind)
                for other in KINDS6:
                    sites[("fetcher*", kind, other)] = lab.add_site(other)
        for i, other in enumerate(RESEED[0]):
            sites[("reseed", "stale", i)] = lab.add_site(other)
        sites[("reseed", "live")] = lab.add_site(RESEED[1])
        sites[("reseed", "fetcher")] = lab.public_host("fetchreseed")
        # the bootstrap relays hold no content: a memory blockstore (fetchers ask them "have")
        with _env(LATTICA_BLOCKS="memory"):
            relays.start("--membership", "on")
        yield lab, relays.addrs, sites, tmp_path_factory.mktemp("blocks")
        for r in relays.procs:
            _kill(r)
    if RESULTS:
        print("\n" + _table())


def _probe(lab: Lab, host, boot: list[str]) -> list[str]:
    """Plain TCP connects from ``host`` to each bootstrap address (tells a lab problem from a
    node's)."""
    out = []
    for b in boot:
        ip, port = b.split("/")[2], int(b.split("/")[4])
        code = (
            f"import socket, time\nt = time.monotonic()\ntry:\n    socket.create_connection(({ip!r}, {port}), timeout=3).close(); print('ok', round(time.monotonic() - t, 3))\n"
            f"except OSError as e:\n    print(repr(e))"
        )
        r = lab.run(host, [sys.executable, "-c", code], check=False, timeout=10)
        out.append(f"{ip}: {(r.stdout + r.stderr).strip()}")
    return out


def _provide_and_fetch(
    lab: Lab,
    boot: list[str],
    blocks,
    kind: str,
    site,
    fetchers: list[tuple[str, object]],
    seed: int,
    name: str | None = None,
) -> dict[str, dict]:
    """A fresh provider on ``site`` (of ``kind``, unused so far); then, one after the other, a
    fresh fetcher on each of ``fetchers`` ((label, host)); returns each fetcher's report with the
    provider's view added. Every process is killed when done."""
    bargs = [x for b in boot for x in ("--bootstrap", b)]
    name = name or f"content-{SHORT[kind]}{'-m' if seed >= 2000 else ''}"
    try:
        prov = Proc(
            lab,
            site.host,
            [
                "provider",
                "--blocks",
                str(blocks / f"{name}-provider"),
                "--size",
                str(SIZE),
                "--seed",
                str(seed),
                *bargs,
            ],
            script=CONTENTPEER,
            ready_within=60,
            log_name=f"{name}-provider",
        )
    except (TimeoutError, EOFError, AssertionError) as e:
        raise AssertionError(
            f"the provider behind {kind} did not start: {e!r}; plain TCP to the relays now: {_probe(lab, site.host, boot)}"
        ) from e
    out = {}
    try:
        for label, host in fetchers:
            f = Proc(
                lab,
                host,
                [
                    "fetcher",
                    "--blocks",
                    str(blocks / f"{name}-{label}"),
                    "--cid",
                    prov.ready["cid"],
                    "--provider",
                    prov.peer_id,
                    *bargs,
                ],
                script=CONTENTPEER,
                ready_within=None,
                log_name=f"{name}-{label}-fetcher",
            )
            try:
                t0 = time.monotonic()
                try:
                    done = f.read(90)
                except (TimeoutError, EOFError) as e:
                    done = {"ok": False, "error": f"{type(e).__name__}: {e}"}
                done["wall_s"] = round(time.monotonic() - t0, 2)
                if str(done.get("error", "")).startswith("init:"):
                    done["error"] += f"; plain TCP to the relays now: {_probe(lab, host, boot)}"
            finally:
                _kill(f)
            prov.p.stdin.write("stats\n")
            prov.p.stdin.flush()
            done["served_bytes"] = prov.read(10).get("served_bytes")
            done["provider"] = {k: prov.ready[k] for k in ("reachability", "relays", "settle_s", "sha256")}
            out[label] = done
    finally:
        _kill(prov)
    return out


def _line(kind: str, label: str, r: dict) -> str:
    prov = r.get("provider", {})
    t = lambda x: "-" if x is None else f"{x:.2f}"  # noqa: E731
    rate = f"{SIZE / r['seconds'] / 1e6:.1f}" if r.get("ok") and r["seconds"] else "-"
    path = ">".join(str(p) for p in r.get("paths") or []) or "-"
    text = (
        f"{SHORT[kind]:<6}{label:<7}{t(r.get('seconds')):>7}{rate:>7}{t(r.get('init_s')):>6}{t(r.get('first_byte_s')):>7}{t(r.get('direct_s')):>8}  "
        f"{(path if r.get('ok') else 'FAIL'):<16}{prov.get('reachability', '?')}/{prov.get('relays', '?')} {t(prov.get('settle_s'))}"
    )
    if not r.get("ok"):
        text += "  " + str(r.get("error"))[:300]
    return text


HEADER = "prov  fetch    get s   MB/s  init  1st B  direct  path            provider (ready at, s)"


def _table() -> str:
    return "\n".join([HEADER] + [_line(k, lbl, r) for (k, lbl), r in RESULTS.items()])


def _check(kind: str, reports: dict[str, dict], seed: int) -> None:
    want = _expected(seed)
    for label, r in reports.items():
        RESULTS[(kind, label)] = r
        print(_line(kind, label, r), flush=True)
    failed = {label: r.get("error") for label, r in reports.items() if not r.get("ok")}
    assert not failed, (kind, failed)
    for label, r in reports.items():
        assert r["provider"]["sha256"] == want
        assert r["sha256"] == want and r["size"] == SIZE, (kind, label)
        assert r["from_provider"] > 0, (kind, label, r)  # (the relays hold nothing; earlier fetchers are dead)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("kind", KINDS6)
def test_get_from_a_provider_behind_each_nat(contentlab, kind):
    lab, boot, sites, blocks = contentlab
    if not RESULTS:
        print("\n" + HEADER, flush=True)
    seed = 1000 + KINDS6.index(kind)
    fetchers = [("pub", sites[("public", kind)]), (SHORT[NAT_FETCHER[kind]], sites[("fetcher", kind)].host)]
    _check(kind, _provide_and_fetch(lab, boot, blocks, kind, sites[("provider", kind)], fetchers, seed), seed)


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("kind", KINDS6)
def test_get_from_a_provider_behind_each_nat_by_a_fetcher_behind_each_nat(contentlab, kind):
    """The whole matrix: fetchers behind each of the six kinds (fresh sites) get from a
    provider behind ``kind``, one after the other (each finds the earlier, dead fetchers among
    the providers too)."""
    lab, boot, sites, blocks = contentlab
    seed = 2000 + KINDS6.index(kind)
    fetchers = [(f"m-{SHORT[other]}", sites[("fetcher*", kind, other)].host) for other in KINDS6]
    _check(kind, _provide_and_fetch(lab, boot, blocks, kind, sites[("provider*", kind)], fetchers, seed), seed)


@pytest.mark.timeout(600)
def test_a_new_provider_behind_a_nat_is_not_held_up_by_stale_provider_records(contentlab):
    """Re-seeding: earlier providers of an object went away, leaving their provider records (and,
    for a while, their relay reservations) behind; a new provider behind a NAT puts the same bytes.
    A fresh fetcher should find and use it at once, not after trying the dead ones in turn."""
    lab, boot, sites, blocks = contentlab
    seed = 3000
    stale, live = RESEED
    for i, kind in enumerate(stale):
        _provide_and_fetch(
            lab, boot, blocks, kind, sites[("reseed", "stale", i)], [], seed, name=f"content-reseed-stale{i}"
        )
    after = _provide_and_fetch(
        lab,
        boot,
        blocks,
        live,
        sites[("reseed", "live")],
        [("fresh", sites[("reseed", "fetcher")])],
        seed,
        name="content-reseed-live",
    )
    r = RESULTS[(live, "r-fresh")] = after["fresh"]
    print(
        "\n"
        + HEADER
        + "\n"
        + _line(live, "r-fresh", r)
        + f"\nother peers the fetch asked [asked, failures]: {r.get('others_asked')}",
        flush=True,
    )
    assert r["provider"]["sha256"] == _expected(seed)
    assert r.get("ok") and r["sha256"] == _expected(seed), r.get("error")
    assert r["seconds"] < 15, (
        f"the get took {r['seconds']:.1f} s (first byte at {r['first_byte_s']} s) with {len(stale)} stale provider "
        f"records; other peers asked [asked, failures]: {r.get('others_asked')}"
    )
