"""The dashboard in a real browser (headless Chromium driven by Selenium): a mesh of node
processes under a supervisor, the page showing its nodes, actors, tree and paths, then a node
killed and the page showing it down and its children running elsewhere; and a page drawing a
simulated mesh of 200 nodes and 5,000 actors. Screenshots go to tmp_path (and to
$LATTICA_SCREENSHOTS when set)."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from lattica.mesh.supervised import supervised_mesh

CHROMIUM = shutil.which("chromium")
DRIVER = shutil.which("chromedriver")

pytestmark = [
    pytest.mark.skipif(
        not (CHROMIUM and DRIVER), reason="needs Debian's chromium and chromium-driver (.ci/run installs them)"
    ),
    pytest.mark.timeout(240),
]


@pytest.fixture
def browser():
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for a in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1400,1800"):
        opts.add_argument(a)
    driver = webdriver.Chrome(service=Service(DRIVER), options=opts)
    try:
        yield driver
    finally:
        driver.quit()


def _shot(driver, tmp_path, name):
    path = tmp_path / f"{name}.png"
    driver.save_screenshot(str(path))
    extra = os.environ.get("LATTICA_SCREENSHOTS")
    if extra:
        os.makedirs(extra, exist_ok=True)
        shutil.copy(path, os.path.join(extra, path.name))
    return path


def _fresh(fn, tries=20):
    """``fn()``, again while an element it found was redrawn under it: the page rebuilds its
    tables at each refresh, so an element found a moment ago may be gone (a stale reference)."""
    from selenium.common.exceptions import StaleElementReferenceException

    for i in range(tries):
        try:
            return fn()
        except StaleElementReferenceException:
            if i == tries - 1:
                raise
            time.sleep(0.1)


def _click(browser, css):
    _fresh(lambda: browser.find_element("css selector", css).click())


def _text(browser, css):
    return _fresh(lambda: browser.find_element("css selector", css).text)


def _attr_and_text(el, attr):
    return el.get_attribute(attr), el.text


def _until(driver, script, timeout=30.0):
    """Poll ``script`` (JS returning a value) until it is truthy; that value."""
    deadline = time.monotonic() + timeout
    while True:
        got = driver.execute_script(script)
        if got or time.monotonic() > deadline:
            return got
        time.sleep(0.2)


def test_the_page_shows_the_mesh_and_a_node_dying_with_its_children_restarted(browser, tmp_path):
    with supervised_mesh(children=4, processes=3, dashboard="127.0.0.1:0") as (here, procs, sup, refs):
        browser.get(here.dashboard_url)
        assert _until(browser, "return document.getElementById('status').dataset.live === 'live'")
        assert _until(browser, "return document.querySelectorAll('#nodes tbody tr[data-state=alive]').length === 4"), (
            browser.page_source[:2000]
        )
        rows = browser.execute_script(
            "return [...document.querySelectorAll('#nodes tbody tr')].map(r => r.dataset.node)"
        )
        assert set(rows) == {str(here.peer_id), *(p.peer_id for p in procs)}
        keepers = browser.execute_script(
            "return [...document.querySelectorAll('#actors tbody tr')].filter(r => r.textContent.includes('.Keeper')).map(r => r.dataset.node)"
        )
        assert len(keepers) == 4 and str(here.peer_id) not in keepers
        children = browser.execute_script(
            "return [...document.querySelectorAll('[data-supervisor] li')].map(li => [li.dataset.child, li.dataset.node])"
        )
        assert sorted(c for c, _ in children) == [f"keeper-{i}" for i in range(4)]
        paths = browser.execute_script(
            "return [...document.querySelectorAll('#paths tbody tr')].map(r => r.dataset.path)"
        )
        assert paths and set(paths) == {"direct"}
        assert _text(browser, "#me").count(str(here.peer_id)) == 1
        _shot(browser, tmp_path, "dashboard-mesh")

        victim = next(p for p in procs if any(n == p.peer_id for _, n in children))
        moved = [c for c, n in children if n == victim.peer_id]
        os.kill(victim.pid, signal.SIGKILL)
        script = f"""
            const row = document.querySelector('#nodes tbody tr[data-node="{victim.peer_id}"]');
            const kids = {json.dumps(moved)}.map(id => document.querySelector(`[data-supervisor] li[data-child="${{id}}"]`));
            return row && row.dataset.state === 'dead'
                && kids.every(li => li && li.dataset.node && li.dataset.node !== '{victim.peer_id}' && +li.dataset.restarts >= 1);
        """
        assert _until(browser, script, timeout=60), _text(browser, "main")[:3000]
        assert _until(
            browser, "return document.querySelectorAll('#events li[data-kind=restart]').length > 0", timeout=20
        )
        # the restarted children's actors, on their new nodes, show their restarts in the actors table
        script = f"""
            const rows = [...document.querySelectorAll('#actors tbody tr')].filter(r => {json.dumps(moved)}.some(id => r.dataset.actor.endsWith('/' + id)));
            return rows.length === {len(moved)} && rows.every(r => r.dataset.node !== '{victim.peer_id}' && +r.lastElementChild.dataset.restarts >= 1);
        """
        assert _until(browser, script, timeout=20), _text(browser, "#actors")[:2000]
        assert browser.execute_script("return document.querySelectorAll('#events li[data-kind=death]').length") > 0
        _shot(browser, tmp_path, "dashboard-node-lost")


def test_the_page_draws_200_nodes_and_5000_actors(browser, tmp_path):
    """A simulated picture, drawn by the page's own code: every node row, the first actor rows
    with a note for the rest, and the filter narrowing them (the draw time is printed; it is a
    figure for docs/benchmarks.md, not a pass mark)."""
    with supervised_mesh(children=1, processes=1, dashboard="127.0.0.1:0") as (here, procs, sup, refs):
        browser.get(here.dashboard_url)
        assert _until(browser, "return document.getElementById('status').dataset.live === 'live'")
        _click(browser, "#pause")  # (the live pictures of the real mesh wait meanwhile)
        took = browser.execute_script("""
            const nodes = [];
            for (let i = 0; i < 200; i++) {
              const pid = '12D3KooWsim' + String(i).padStart(41, '0');
              const actors = [];
              for (let j = 0; j < 25; j++) actors.push({name: `worker-${i}-${j}`, class: 'app.Worker', state: 'running', system: false,
                                                       mailbox: j % 3, running: 1, calls: i * j, errors: 0});
              nodes.push({peer_id: pid, state: i % 50 === 7 ? 'dead' : 'alive', self: i === 0, cpu: 8, memory: 1 << 34, gpus: 1,
                          labels: {zone: 'z' + (i % 4)}, load: 0.5, rtt_ms: 1.2,
                          report: {peer_id: pid, nat: {reachability: 'public', reason: 'sim'}, addrs: [], actor_count: 25,
                                   peers: [{peer_id: '12D3KooWsim' + String((i + 1) % 200).padStart(41, '0'), path: i % 3 ? 'direct' : 'relayed',
                                            transport: 'tcp', direction: 'outbound'}],
                                   actors, supervisors: [], dht: {table: 20, records: 5, rejected: 0}}});
            }
            const t0 = performance.now();
            draw({self: nodes[0].peer_id, time: Date.now() / 1000, nodes, events: []});
            return performance.now() - t0;
        """)
        print(f"\ndashboard draw of 200 nodes / 5000 actors: {took:.0f} ms")
        assert browser.execute_script("return document.querySelectorAll('#nodes tbody tr').length") == 200
        assert browser.execute_script("return document.querySelectorAll('#actors tbody tr').length") == 500
        assert "4500 more" in _text(browser, "#actors-more")
        assert browser.execute_script("return document.querySelector('[data-count=actors]').textContent") == "5000"
        box = browser.find_element("id", "filter")
        box.send_keys("worker-17-")
        assert _until(browser, "return document.querySelectorAll('#actors tbody tr').length === 25", timeout=5)
        _shot(browser, tmp_path, "dashboard-200-nodes")


def test_a_hostile_member_cannot_inject_into_the_page_or_move_it(browser, tmp_path):
    from lattica._node import Node

    tag = '<b id="pwned">x</b><meta http-equiv="refresh" content="0;url=http://127.0.0.1:9/">'
    with Node(["/ip4/127.0.0.1/tcp/0"], dashboard="127.0.0.1:0") as watcher, Node(["/ip4/127.0.0.1/tcp/0"]) as evil:
        watcher.connect(evil.addrs[0])

        async def report():
            return {
                "peer_id": tag,
                "actor_count": tag,
                "peers": [{"peer_id": tag, "path": tag, "transport": tag, "rtt_ms": tag}],
                "actors": [
                    {
                        "name": tag,
                        "class": tag,
                        "state": tag,
                        "mailbox": tag,
                        "running": tag,
                        "calls": tag,
                        "errors": tag,
                    }
                ],
                "supervisors": [
                    {
                        "name": tag,
                        "strategy": tag,
                        "children": [{"id": tag, "node": tag, "restarts": tag, "class": tag}],
                    }
                ],
                "dht": {"table": tag, "records": tag},
                "content": {"transfers": [{"cid": 5, "bytes": tag, "total": tag, "peers": tag}]},
                "pubsub": {"topics": [{"topic": tag, "mesh": tag}]},
                "crdt": {"docs": [{"name": tag, "applied": tag}]},
                "nat": {"reachability": tag, "reason": tag},
                "time": float("nan"),
            }

        evil._host.services.dashboard.report = report
        browser.get(watcher.dashboard_url)
        assert _until(browser, f"return !!document.querySelector('#nodes tbody tr[data-node=\"{evil.peer_id}\"]')")
        assert _until(
            browser, "return document.getElementById('filter') && document.body.textContent.includes('pwned')"
        )  # drawn as text
        time.sleep(1.5)  # (a meta refresh would have moved the page by now)
        assert browser.execute_script(
            "return document.getElementById('pwned') === null && !document.querySelector('meta[http-equiv]')"
        )
        assert browser.current_url.startswith(watcher.dashboard_url.rstrip("/"))
        assert browser.execute_script("return document.getElementById('status').dataset.live") == "live"
        _shot(browser, tmp_path, "dashboard-hostile-member")


def test_the_page_works_off_loopback_with_its_token(browser):
    from urllib.parse import urlsplit

    from lattica._node import Node

    with Node(["/ip4/127.0.0.1/tcp/0"], dashboard="0.0.0.0:0") as node:
        parts = urlsplit(node.dashboard_url)
        browser.get(f"http://127.0.0.1:{parts.port}/?{parts.query}")
        assert _until(browser, "return document.getElementById('status').dataset.live === 'live'")
        assert _until(browser, f"return !!document.querySelector('#nodes tbody tr[data-node=\"{node.peer_id}\"]')")
        browser.get(f"http://127.0.0.1:{parts.port}/")  # without the token: the page loads, its data does not
        time.sleep(1.0)
        assert not browser.execute_script("return document.querySelectorAll('#nodes tbody tr').length")


DRIVER_SCRIPT = """\
import logging, sys
import lattica

@lattica.actor
class Flaky:
    def __init__(self):
        print("flaky starting")
    def work(self, x):
        print("working on", x)
        logging.getLogger("flaky").warning("input %s", x)
        if x % 3 == 2:
            raise ValueError(f"cannot take {x}")
        return x

@lattica.actor
class Broken:
    def __init__(self):
        print("about to fail", file=sys.stderr)
        raise RuntimeError("no GPU here")

@lattica.actor
class Lonely:
    async def ping(self):
        return "pong"

node = lattica.init(bootstrap=[sys.argv[1]])
flaky = Flaky.options(node=sys.argv[2], name="flaky").remote()
for i in range(9):
    try:
        lattica.get(flaky.work.remote(i))
    except ValueError:
        pass
try:
    Broken.options(node=sys.argv[2], name="broken").remote()
except Exception as e:
    print("broken:", type(e).__name__, file=sys.stderr)
lonely = Lonely.options(node=sys.argv[3], name="lonely").remote()
lattica.get(lonely.ping.remote())
doc = lattica.crdt.open("notes")
print(node.peer_id, flush=True)
sys.stdin.read()
"""


def _ink(png: bytes, rgb: tuple, tolerance: int = 40) -> int:
    """Pixels of a screenshot within ``tolerance`` of the colour ``rgb``."""
    import io

    from PIL import Image

    img = Image.open(io.BytesIO(png)).convert("RGB")
    return sum(1 for p in img.getdata() if all(abs(a - b) <= tolerance for a, b in zip(p, rgb)))


def _element_shot(browser, tmp_path, css, name):
    """A screenshot of one element (saved beside the others): its PNG bytes, checked to be the
    element's size."""
    import io

    from PIL import Image

    el, png = _fresh(lambda: _sized_png(browser.find_element("css selector", css)))
    (tmp_path / f"{name}.png").write_bytes(png)
    extra = os.environ.get("LATTICA_SCREENSHOTS")
    if extra:
        os.makedirs(extra, exist_ok=True)
        (Path(extra) / f"{name}.png").write_bytes(png)
    w, h = Image.open(io.BytesIO(png)).size
    size = el["size"]
    assert abs(w - size["width"]) <= 2 and abs(h - size["height"]) <= 2 and w > 0 and h > 0, (w, h, size)
    return png


def _sized_png(el):
    """An element's size and its screenshot (both from one rendering of it)."""
    return {"size": el.size}, el.screenshot_as_png


BLUE = (0x25, 0x63, 0xEB)  # the charts' line
RED = (0xB9, 0x1C, 0x1C)  # errors, failures, lost actors
AMBER = (0xB4, 0x53, 0x09)  # a warning (reachability unknown, suspect, relayed)
GREY = (0x6B, 0x72, 0x80)  # explanations, muted text
INK = (0x1D, 0x23, 0x30)  # text


def test_the_page_explains_failures_with_errors_output_utilisation_jobs_and_lost_actors(browser, tmp_path):
    from lattica._node import Node
    from lattica.mesh.process import ServerProcess

    tcp = "/ip4/127.0.0.1/tcp/0"
    script = tmp_path / "driver.py"
    script.write_text(DRIVER_SCRIPT)
    with ServerProcess([tcp]) as worker, ServerProcess([tcp]) as doomed, Node([tcp], dashboard="127.0.0.1:0") as here:
        here.connect(worker.addr("tcp"))
        here.connect(doomed.addr("tcp"))
        driver = subprocess.Popen(
            [sys.executable, str(script), worker.addr("tcp"), worker.peer_id, doomed.peer_id],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=tmp_path,
        )
        try:
            driver_id = driver.stdout.readline().strip()
            assert driver_id.startswith("12D3KooW"), driver.stderr.read()
            browser.get(here.dashboard_url)
            assert _until(browser, "return document.getElementById('status').dataset.live === 'live'")
            assert _until(
                browser,
                "return !!document.querySelector('#actors tbody tr[data-actor=flaky] .last-error')?.textContent.includes('ValueError')",
            )

            # counts agree: the tile, the nodes' column and the table (user actors; system ones apart)
            counts = browser.execute_script("""
                const sum = (sel) => [...document.querySelectorAll(sel)].reduce((s, td) => s + (+td.textContent || 0), 0);
                return {tile: +document.querySelector('[data-count=actors]').textContent, column: sum('#nodes tbody td[data-actors]'),
                        rows: document.querySelectorAll('#actors tbody tr').length,
                        system: +document.querySelector('[data-count=system]').textContent,
                        systemColumn: sum('#nodes tbody td:nth-child(5)')};""")
            assert (
                counts["tile"] == counts["column"] == counts["rows"] >= 2
                and counts["system"] == counts["systemColumn"] > 0
            ), counts
            _click(browser, "#show-system")
            assert _until(
                browser,
                f"return document.querySelectorAll('#actors tbody tr').length === {counts['rows'] + counts['system']}",
            )
            _click(browser, "#show-system")
            # load in words, reachability on a loopback mesh explained, internal topics hidden
            loads = browser.execute_script(
                "return [...document.querySelectorAll('#nodes tbody td:nth-child(7)')].map(td => td.textContent)"
            )
            assert any("actor" in t for t in loads) and not any("{" in t for t in loads), loads
            reach, me = _fresh(
                lambda: _attr_and_text(
                    browser.find_element("css selector", "#me [data-reachability]"), "data-reachability"
                )
            )
            assert reach == "loopback" and "loopback only" in me and "nothing outside this machine" in me
            assert _until(
                browser, "return document.getElementById('topics-hidden').textContent.includes('1 internal topic')"
            )
            assert not browser.execute_script(
                "return [...document.querySelectorAll('#topics tbody td')].some(td => td.textContent.startsWith('lattica/'))"
            )
            # nothing clipped at 1400 px: every card's content fits its width
            clipped = browser.execute_script("""return [...document.querySelectorAll('.card')].filter(c => !c.hidden && c.scrollWidth > c.clientWidth + 1)
                                                 .map(c => (c.querySelector('h2') || c).textContent.slice(0, 40) + ': ' + c.scrollWidth + '>' + c.clientWidth)""")
            assert not clipped, clipped
            _shot(browser, tmp_path, "dashboard-overview")
            png = _element_shot(
                browser, tmp_path, "#me", "dashboard-loopback"
            )  # explained in grey, not the warning's amber
            assert _ink(png, AMBER, 30) == 0 and _ink(png, GREY, 30) > 100
            png = _element_shot(browser, tmp_path, "#summary", "dashboard-tiles")
            assert _ink(png, INK, 30) > 300  # (the tiles' figures and words are drawn)
            png = _element_shot(browser, tmp_path, "#topics-hidden", "dashboard-internal-topics")
            assert _ink(png, GREY, 30) > 50

            # an actor's errors with their tracebacks, its output and its utilisation, from its node
            _click(browser, "#actors tbody tr[data-actor=flaky]")
            assert _until(browser, "return document.querySelector('#detail[data-kind=actor] ol.errors')")
            panel = _text(browser, "#detail")
            assert (
                "ValueError: cannot take 8" in panel
                and 'raise ValueError(f"cannot take {x}")' in panel
                and "driver.py" in panel
            )
            assert "flaky starting" in panel and "working on 4" in panel and "WARNING flaky: input 4" in panel
            assert panel.count("input 4") == 1  # (a log record printed to stderr by its handler is shown once)
            assert _until(
                browser,
                "return [...document.querySelectorAll('#detail figure[data-chart]')].some(f => +f.dataset.points >= 2)",
                timeout=20,
            )
            # what it holds, estimated while the panel is open, and charted from then on
            assert _until(browser, "return +document.querySelector('#detail [data-memory]')?.dataset.memory > 0")
            assert _until(
                browser,
                "return +document.querySelector('#detail figure[data-chart^=memory]')?.dataset.points >= 1",
                timeout=20,
            )
            png = _element_shot(browser, tmp_path, "#detail", "dashboard-actor-errors")
            assert _ink(png, RED) > 50 and _ink(png, BLUE) > 30  # (the error types in red, the chart lines drawn)

            # a node's utilisation over time
            _click(browser, f"#nodes tbody tr[data-node='{worker.peer_id}']")
            assert _until(
                browser, "return document.querySelectorAll('#detail[data-kind=node] figure[data-chart]').length === 4"
            )
            assert _until(
                browser,
                "return [...document.querySelectorAll('#detail figure[data-chart]')].every(f => +f.dataset.points >= 2)",
                timeout=20,
            )
            png = _element_shot(browser, tmp_path, "#detail", "dashboard-node-utilisation")
            assert _ink(png, BLUE) > 200

            # the job view: the driver process and the actors it started
            job = _text(browser, f"#jobs tbody tr[data-job='{driver_id}']")
            assert "driver.py" in job and "alive" in job, job
            _click(browser, f"#jobs tbody tr[data-job='{driver_id}']")
            assert _until(
                browser,
                """return [...document.querySelectorAll('#actors tbody tr')].map(r => r.dataset.actor).sort().join() === 'flaky,lonely'""",
            )
            _element_shot(browser, tmp_path, "#jobs", "dashboard-jobs")
            _click(browser, f"#jobs tbody tr[data-job='{driver_id}']")

            # an actor that failed to start: in "ended lately", with why
            _click(browser, "#ended tbody tr[data-actor=broken]")
            assert _until(
                browser,
                "return document.querySelector('#detail[data-kind=actor]')?.textContent.includes('Why it failed')",
            )
            panel = _text(browser, "#detail")
            assert "RuntimeError: no GPU here" in panel and "about to fail" in panel, panel[:2000]
            png = _element_shot(browser, tmp_path, "#detail", "dashboard-failed-start")
            assert _ink(png, RED) > 50

            # an unsupervised actor lost with its node
            os.kill(doomed.pid, signal.SIGKILL)
            assert _until(
                browser,
                "return [...document.querySelectorAll('#events li[data-kind=lost]')].some(li => li.textContent.includes('lonely'))",
                timeout=60,
            )
            png = _element_shot(browser, tmp_path, "#events", "dashboard-lost-actor")
            assert _ink(png, RED) > 50
        finally:
            driver.kill()
            driver.wait()
