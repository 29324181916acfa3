"""Code that travels, against bad senders and bad bytes: a tampered package, one over the cap, a
ticket forged or forwarded from a member, a stranger's code, a package a supervisor restarts
elsewhere, and a node that restarts holding cached packages (nodes of this process)."""

import sys
import textwrap

import pytest

import lattica
from helpers import call_as, wait_for
from lattica._code.package import pack
from lattica._code.tickets import Ticket
from lattica._runtime import spawner_ref
from lattica.config import ContentConfig
from lattica.content._cid import Cid
from lattica.errors import CodeError, PermissionDenied, SpawnError
from lattica.trust import MeshKey

pytestmark = pytest.mark.timeout(90)

TCP = "/ip4/127.0.0.1/tcp/0"


@pytest.fixture
def app(tmp_path, monkeypatch):
    """A driver's code folder: ``shipped_app.py`` with an actor class, importable here only (and a
    HOME of the test's own: every node's blockstore starts empty)."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    folder = tmp_path / "app"
    folder.mkdir()
    (folder / "shipped_app.py").write_text(
        textwrap.dedent("""\
        import lattica

        @lattica.actor
        class Echo:
            def echo(self, x):
                return ("echo", x)
    """)
    )
    monkeypatch.syspath_prepend(str(folder))
    sys.modules.pop("shipped_app", None)
    import shipped_app

    yield folder, shipped_app.Echo
    sys.modules.pop("shipped_app", None)


def spawn_call(node, target, path, code, name="echo-1"):
    return call_as(node, spawner_ref(target.peer_id), "spawn", path, [], None, name, {"code": code}, timeout=20)


def connected(*nodes):
    for n in nodes[1:]:
        n.connect(nodes[0].addrs[0])


def test_a_shipped_class_spawns_and_calls(app):
    folder, Echo = app
    key = MeshKey.generate()
    with lattica.Node([TCP], mesh=key, code=[str(folder)]) as driver, lattica.Node([TCP], mesh=key) as target:
        connected(target, driver)
        ref = driver.run(_remote(Echo.options(node=target.peer_id)), timeout=20)
        assert call_as(driver, ref, "echo", 5) == ("echo", 5)
        library = target.host.services.code.library
        assert len(library.loaded) == 1 and library.sender_of(ref.name) == driver.peer_id
        call_as(driver, spawner_ref(target.peer_id), "kill", ref.name)
        wait_for(lambda: not library.loaded, timeout=5)  # its last actor ended: unloaded
        assert not [m for m in sys.modules if m.startswith("_lattica_code_")]


async def _remote(actor_class):
    ref = actor_class.remote()
    await ref._spawn
    return ref


def test_a_tampered_package_is_refused(app):
    folder, Echo = app
    key = MeshKey.generate()
    with (
        lattica.Node([TCP], mesh=key, code=[str(folder)]) as driver,
        lattica.Node([TCP], mesh=key, content=ContentConfig(find_timeout=2.0, block_timeout=1.0)) as target,
    ):
        connected(target, driver)
        data = pack([str(folder)]).encode()
        cid = Cid.of(data)
        bad = bytearray(data)
        bad[-3] ^= 0xFF
        driver.host.services.content.store.put(cid, bytes(bad), verified=True)  # served as the package
        ticket = Ticket.issue(str(cid), driver.keypair, driver.trust.presented)
        with pytest.raises(CodeError, match="could not be fetched"):
            spawn_call(driver, target, "shipped_app.Echo", ticket.to_wire())
        assert not target.host.services.code.library.loaded


def test_a_package_over_the_cap_is_refused(app):
    folder, Echo = app
    (folder / "padding.py").write_text("#" * 4000 + "\n")
    key = MeshKey.generate()
    with lattica.Node([TCP], mesh=key, code=[str(folder)]) as driver, lattica.Node([TCP], mesh=key) as target:
        connected(target, driver)
        target.host.services.code.library.max_bytes = 1000
        with pytest.raises(CodeError, match="over this node's cap of 1000"):
            driver.run(_remote(Echo.options(node=target.peer_id)), timeout=20)


def test_forged_and_forwarded_tickets_and_a_strangers_code_are_refused(app, tmp_path):
    folder, Echo = app
    key = MeshKey.generate()
    member_key = lattica.KeyPair.generate()
    cert = key.issue(member_key.peer_id, 3600)
    with (
        lattica.Node([TCP], mesh=key, code=[str(folder)]) as admin,
        lattica.Node([TCP], mesh=key) as target,
        lattica.Node([TCP], mesh=cert.to_text(), keypair=member_key, code=[str(folder)]) as member,
        lattica.Node([TCP], mesh=MeshKey.generate(), code=[str(folder)]) as stranger,
    ):
        connected(target, admin, member, stranger)
        # the member's own code: refused by a node that runs administrators' code only
        with pytest.raises(PermissionDenied, match="accept_code='admins'"):
            member.run(_remote(Echo.options(node=target.peer_id)), timeout=20)
        member_ticket = member.host.services.code.shipper.ticket_now(Echo.cls)  # (what the member signed)
        # an administrator forwarding the member's ticket does not make it an administrator's code
        with pytest.raises(PermissionDenied, match="refuses code from " + str(member.peer_id)):
            spawn_call(admin, target, "shipped_app.Echo", member_ticket.to_wire())
        # a ticket naming the administrator, signed by someone else
        forged = Ticket(member_ticket.cid, admin.peer_id, member_ticket.signature, admin.trust.presented)
        with pytest.raises(PermissionDenied, match="not signed by"):
            spawn_call(admin, target, "shipped_app.Echo", forged.to_wire())
        # the administrator's own ticket, repeated by a member: who asks counts as much as who wrote it
        admin_ticket = admin.host.services.code.shipper.ticket_now(Echo.cls)
        with pytest.raises(PermissionDenied, match=f"refuses to run code that {member.peer_id} \\(member\\) asks for"):
            spawn_call(member, target, "shipped_app.Echo", admin_ticket.to_wire())
        # a stranger reaches no spawner at all
        with pytest.raises(PermissionDenied):
            stranger.run(_remote(Echo.options(node=target.peer_id)), timeout=20)
        assert not target.host.services.code.library.loaded


def test_a_supervisor_restarts_a_shipped_child_on_another_node(app):
    folder, Echo = app
    key = MeshKey.generate()
    with (
        lattica.Node([TCP], mesh=key, code=[str(folder)]) as driver,
        lattica.Node([TCP], mesh=key) as sup_node,
        lattica.Node([TCP], mesh=key) as a,
        lattica.Node([TCP], mesh=key) as b,
    ):
        connected(driver, sup_node, a, b)
        wait_for(lambda: len([n for n in driver.nodes() if n["state"] == "alive"]) == 4, timeout=10)

        async def start():
            sup = lattica.Supervisor.options(node=sup_node.peer_id).remote(
                children=[{"cls": Echo, "id": "echo", "node": str(a.peer_id)}]
            )
            await sup._spawn
            return sup

        sup = driver.run(start(), timeout=30)
        wait_for(lambda: a.host.services.code.library.loaded, timeout=10)  # the child runs from the package on a
        a.stop()

        def where():
            return call_as(driver, sup, "which_children")[0]["node"]

        wait_for(lambda: where() not in (None, str(a.peer_id)), timeout=20)
        assert where() in (str(b.peer_id), str(driver.peer_id), str(sup_node.peer_id))
        ref = call_as(driver, sup, "children")[0]
        assert call_as(driver, ref, "echo", 3) == ("echo", 3)


def test_a_restarted_node_runs_a_package_from_its_own_blockstore(app, tmp_path):
    folder, Echo = app
    key = MeshKey.generate()
    blocks = tmp_path / "blocks"
    target_key = lattica.KeyPair.generate()
    with lattica.Node([TCP], mesh=key, code=[str(folder)]) as driver:
        with lattica.Node([TCP], mesh=key, keypair=target_key, content=ContentConfig(blocks=str(blocks))) as target:
            connected(target, driver)
            ref = driver.run(_remote(Echo.options(node=target.peer_id, lifetime="detached")), timeout=20)
            assert call_as(driver, ref, "echo", 1) == ("echo", 1)
        ticket = driver.host.services.code.shipper.ticket_now(Echo.cls)
    # the driver is gone; another administrator, who never held the package, asks with its ticket
    with (
        lattica.Node([TCP], mesh=key, keypair=target_key, content=ContentConfig(blocks=str(blocks))) as target,
        lattica.Node([TCP], mesh=key, code=False) as other,
    ):
        connected(target, other)
        ref = spawn_call(other, target, "shipped_app.Echo", ticket.to_wire(), name="echo-2")
        assert call_as(other, ref, "echo", 2) == ("echo", 2)


def test_placement_skips_nodes_that_would_refuse_the_code(app):
    folder, Echo = app
    key = MeshKey.generate()
    worker = {"role": "worker"}
    with (
        lattica.Node([TCP], mesh=key, code=[str(folder)]) as driver,
        lattica.Node([TCP], mesh=key, labels=worker, accept_code="nobody") as closed,
        lattica.Node([TCP], mesh=key, labels=worker) as open_,
    ):
        connected(driver, closed, open_)
        wait_for(lambda: sum(1 for n in driver.nodes() if n["state"] == "alive" and n.get("code")) == 3, timeout=10)

        async def place(n):
            refs = [Echo.options(labels=worker, resources={"cpu": 0.01}).remote() for _ in range(n)]
            for r in refs:
                await r._spawn
            return refs

        refs = driver.run(place(4), timeout=30)
        assert {r.peer_id for r in refs} == {open_.peer_id}
        open_.stop()
        wait_for(
            lambda: all(n["state"] != "alive" for n in driver.nodes() if n["peer_id"] == str(open_.peer_id)), timeout=10
        )
        with pytest.raises(
            lattica.errors.PlacementError,
            match=str(closed.peer_id)[-8:] + r": it runs no code that travels \(accept_code='nobody'\)",
        ):
            driver.run(place(1), timeout=30)


def test_a_failed_spawn_leaves_no_package_and_a_slow_import_does_not_stall_the_node(app):
    folder, Echo = app
    (folder / "slow_app.py").write_text(
        "import time\nimport lattica\ntime.sleep(2)\n\n@lattica.actor\nclass Slow:\n    def ok(self):\n        return 1\n"
    )
    key = MeshKey.generate()
    with lattica.Node([TCP], mesh=key, code=[str(folder)]) as driver, lattica.Node([TCP], mesh=key) as target:
        connected(target, driver)
        ticket = driver.host.services.code.shipper.ticket_now(Echo.cls).to_wire()
        with pytest.raises(SpawnError, match="defines no 'Missing'"):
            spawn_call(driver, target, "shipped_app.Missing", ticket)
        assert not target.host.services.code.library.loaded
        assert not [m for m in sys.modules if m.startswith("_lattica_code_")]

        async def spawn_slow_while_pinging():
            import asyncio
            import time

            spawn = asyncio.ensure_future(
                driver.host.runtime.call(
                    spawner_ref(target.peer_id),
                    "spawn",
                    ("slow_app.Slow", [], None, "slow", {"code": ticket}),
                    {},
                    timeout=30,
                )
            )
            await asyncio.sleep(0.5)  # the import sleeps 2 s on the target
            t0 = time.monotonic()
            names = await driver.host.runtime.call(spawner_ref(target.peer_id), "names", (), {}, timeout=5)
            answered = time.monotonic() - t0
            await spawn
            return answered, names

        answered, names = driver.run(spawn_slow_while_pinging(), timeout=30)
        assert answered < 1.5, (
            f"the target's loop stalled {answered:.2f} s during an import (a stalled one answers after it, >= 1.5 s)"
        )


def test_one_caller_cannot_hold_the_spawner_with_spawns_that_wait_on_a_fetch(app):
    folder, Echo = app
    key = MeshKey.generate()
    with (
        lattica.Node([TCP], mesh=key, code=[str(folder)]) as driver,
        lattica.Node([TCP], mesh=key, content=ContentConfig(find_timeout=3.0, block_timeout=1.0)) as target,
    ):
        connected(target, driver)
        stale = Ticket.issue(str(Cid.of(b"a package nobody holds")), driver.keypair, driver.trust.presented).to_wire()

        async def flood():
            import asyncio

            calls = [
                driver.host.runtime.call(
                    spawner_ref(target.peer_id),
                    "spawn",
                    ("shipped_app.Echo", [], None, f"e{i}", {"code": stale}),
                    {},
                    timeout=30,
                )
                for i in range(40)
            ]
            await asyncio.sleep(0.3)
            names = await driver.host.runtime.call(spawner_ref(target.peer_id), "names", (), {}, timeout=2)
            return names, await asyncio.gather(*calls, return_exceptions=True)

        names, outcomes = driver.run(flood(), timeout=60)
        busy = [o for o in outcomes if isinstance(o, CodeError) and "in progress" in str(o)]
        assert len(busy) == 40 - 8 and all(isinstance(o, (CodeError, SpawnError)) for o in outcomes)
        assert "spawner" in names  # it answered while the fetches waited


def test_get_if_exists_returns_only_an_actor_of_the_same_class(app):
    folder, Echo = app
    key = MeshKey.generate()
    with (
        lattica.Node([TCP], mesh=key, code=[str(folder)], allow=["lattica.*"]) as driver,
        lattica.Node([TCP], mesh=key) as target,
    ):
        connected(target, driver)
        first = driver.run(_remote(Echo.options(node=target.peer_id, name="shared", get_if_exists=True)), timeout=20)
        again = driver.run(_remote(Echo.options(node=target.peer_id, name="shared", get_if_exists=True)), timeout=20)
        assert again.name == first.name and call_as(driver, again, "echo", 1) == ("echo", 1)
        with pytest.raises(
            SpawnError, match="'shared' on .* is a shipped_app.Echo, not a lattica.supervisor.Supervisor"
        ):
            driver.run(
                _remote(lattica.Supervisor.options(node=target.peer_id, name="shared", get_if_exists=True)), timeout=20
            )


def test_a_spawn_that_fails_does_not_unload_the_package_under_another_in_progress(app):
    folder, Echo = app
    (folder / "lazy_app.py").write_text(
        "import time\nimport lattica\ntime.sleep(1)\n\n@lattica.actor\nclass Lazy:\n"
        "    def later(self):\n        import shipped_app\n        return shipped_app.__name__\n"
    )
    key = MeshKey.generate()
    with lattica.Node([TCP], mesh=key, code=[str(folder)]) as driver, lattica.Node([TCP], mesh=key) as target:
        connected(target, driver)
        ticket = driver.host.services.code.shipper.ticket_now(Echo.cls).to_wire()

        async def both():
            import asyncio

            call = driver.host.runtime.call
            slow = asyncio.ensure_future(
                call(
                    spawner_ref(target.peer_id),
                    "spawn",
                    ("lazy_app.Lazy", [], None, "lazy", {"code": ticket}),
                    {},
                    timeout=30,
                )
            )
            await asyncio.sleep(0.3)  # its import is under way
            failed = await asyncio.gather(
                call(
                    spawner_ref(target.peer_id),
                    "spawn",
                    ("shipped_app.Missing", [], None, "m", {"code": ticket}),
                    {},
                    timeout=30,
                ),
                return_exceptions=True,
            )
            return await slow, failed[0]

        ref, failed = driver.run(both(), timeout=30)
        assert isinstance(failed, SpawnError)
        assert call_as(driver, ref, "later").endswith("shipped_app")  # its package is still loaded
