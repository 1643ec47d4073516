"""Failover driven by events (issue 9): replicas behind a router, the edge re-handshakes when its
replica's token vanishes or a drain notice comes, and a restarted replica's token ends a backoff.

The backoff is set to 30 s in these tests: an edge that waited for it would fail every deadline,
so passing them shows the events, not a timer, drove the reconnects. Real ``servo-serve``
subprocesses (kill -9 is the point) behind a router opened in the test, on 127.0.0.1.
"""

from __future__ import annotations

import contextlib
import signal
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import msgspec
import pytest

from servo.edge.failsafe import EngineState
from servo.edge.remote import RemoteEngine
from servo.transport import ZenohSettings, open_zsession
from tests.edge.harness import MergeLog, Proc, edge_config, running_edge, small_sim, start_server, write_manifest
from tests.support import eventually, free_port

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

#: Longer than every deadline below: reaching one through a backoff is impossible.
BACKOFF_S = 30.0


def replica_manifest(
    directory: Path, router_port: int, replica: str, *, revision: str = "v1", lease_ms: int = 1000
) -> Path:
    """A replica of the reference policy joining the router (its own identity in ``directory``)."""
    directory.mkdir(parents=True, exist_ok=True)
    serving = f'[serving]\napp = "fleet"\nreplica = "{replica}"'
    path = directory / "manifest.toml"
    return write_manifest(path, free_port(), revision=revision, connect=router_port, lease_ms=lease_ms, extra=serving)


@asynccontextmanager
async def router() -> AsyncIterator[int]:
    """A plain Zenoh router on a free port, for the whole block."""
    port = free_port()
    async with open_zsession(ZenohSettings(mode="router", listen=[f"tcp/127.0.0.1:{port}"])):
        yield port


@asynccontextmanager
async def two_replicas(
    tmp_path: Path, *, lease_ms: int = 1000
) -> AsyncIterator[tuple[int, dict[str, Path], dict[str, Proc]]]:
    """A router and replicas ``a`` and ``b`` joined to it; yields the router port, the replicas'
    manifests and processes (a test may replace one). Every process is stopped at the end."""
    async with router() as router_port:
        manifests = {name: replica_manifest(tmp_path / name, router_port, name, lease_ms=lease_ms) for name in "ab"}
        servers: dict[str, Proc] = {}
        try:
            for name, path in manifests.items():
                servers[name] = await anyio.to_thread.run_sync(start_server, path)
            yield router_port, manifests, servers
        finally:
            for server in servers.values():
                server.stop()


def fleet_edge(router_port: int) -> tuple[RemoteEngine, MergeLog]:
    config = edge_config(
        router_port,
        app="fleet",
        max_offline_s=120.0,
        reconnect_initial_backoff_s=BACKOFF_S,
        reconnect_max_backoff_s=BACKOFF_S,
    )
    engine = RemoteEngine(config, small_sim().spec())
    return engine, MergeLog.attach(engine)


def serving_replica(engine: RemoteEngine) -> str:
    assert engine.server is not None
    return engine.server.keys.replica


async def test_kill_9_of_the_serving_replica_fails_over_at_once(tmp_path: Path) -> None:
    async with two_replicas(tmp_path) as (router_port, manifests, servers):
        engine, log = fleet_edge(router_port)
        async with running_edge(small_sim(), engine) as run:
            await eventually(lambda: engine.chunks_received >= 3, 15, "streaming")
            first = serving_replica(engine)
            other = "b" if first == "a" else "a"
            merged = len(log.merges)
            servers[first].kill()
            await eventually(
                lambda: (
                    engine.session is not None
                    and serving_replica(engine) == other
                    and len(log.merges) > merged
                    and log.merges[-1].session_id == engine.session.session_id
                ),
                10,
                "a fresh chunk from the other replica",
            )
            assert engine.failsafe.reconnects == 1
            assert engine.state is EngineState.STREAMING
            # The killed replica restarts: the edge stays where it is (no needless move).
            servers[first] = await anyio.to_thread.run_sync(start_server, manifests[first])
            chunks = engine.chunks_received
            await eventually(lambda: engine.chunks_received >= chunks + 3, 10, "streaming on")
            assert serving_replica(engine) == other
            summary = await run.stop()
    assert summary.reconnects == 1
    assert summary.parked


async def test_a_hung_replica_is_left_when_its_lease_expires(tmp_path: Path) -> None:
    # SIGSTOP sends no FIN (a frozen host, a pulled cable): only the 500 ms lease tells.
    async with two_replicas(tmp_path, lease_ms=500) as (router_port, _, servers):
        frozen = None
        try:
            engine, _ = fleet_edge(router_port)
            async with running_edge(small_sim(), engine) as run:
                await eventually(lambda: engine.chunks_received >= 3, 15, "streaming")
                first = serving_replica(engine)
                frozen = servers[first].popen
                frozen.send_signal(signal.SIGSTOP)
                chunks = engine.chunks_received
                # Well inside the 2 x 5 s timeout streak: the lease, not the timeouts, moved it.
                await eventually(
                    lambda: (
                        engine.session is not None
                        and serving_replica(engine) != first
                        and engine.chunks_received > chunks
                    ),
                    4,
                    "a chunk from the other replica",
                )
                # Whichever the lease ended first (the token, or the observation subscriber's match
                # making sends fail), never the request timeouts.
                left = [t.reason for t in engine.failsafe.transitions if t.state is EngineState.RECONNECTING]
                assert left, "the edge never reconnected"
                assert "timed out" not in left[-1], left
                await run.stop()
        finally:
            if frozen is not None:  # thawed before two_replicas stops it: a stopped process cannot drain
                frozen.send_signal(signal.SIGCONT)


async def test_a_drain_notice_moves_the_edge_to_another_replica(tmp_path: Path) -> None:
    async with two_replicas(tmp_path) as (router_port, _, servers):
        engine, _ = fleet_edge(router_port)
        async with running_edge(small_sim(), engine) as run:
            await eventually(lambda: engine.chunks_received >= 3, 15, "streaming")
            first = serving_replica(engine)
            servers[first].popen.terminate()  # SIGTERM: drain
            await eventually(
                lambda: engine.session is not None and serving_replica(engine) != first,
                10,
                "a session on the other replica",
            )
            assert "draining" in [t.reason for t in engine.failsafe.transitions][-2]
            chunks = engine.chunks_received
            await eventually(lambda: engine.chunks_received >= chunks + 3, 10, "streaming there")
            await run.stop()


async def test_a_restarted_replica_is_used_as_soon_as_its_token_appears(tmp_path: Path) -> None:
    async with router() as router_port:
        manifest = replica_manifest(tmp_path / "a", router_port, "a")
        server: Proc = await anyio.to_thread.run_sync(start_server, manifest)
        try:
            engine, _ = fleet_edge(router_port)
            async with running_edge(small_sim(), engine) as run:
                await eventually(lambda: engine.chunks_received >= 3, 15, "streaming")
                server.kill()
                # Nobody answers now: the edge backs off (30 s) until a replica token appears.
                await eventually(lambda: engine.state is EngineState.RECONNECTING, 5, "RECONNECTING")
                await eventually(lambda: engine.session is None, 5, "the dead session closed")
                chunks = engine.chunks_received
                server = await anyio.to_thread.run_sync(start_server, manifest)
                await eventually(lambda: engine.chunks_received > chunks, 10, "a chunk from the restarted replica")
                assert engine.state is EngineState.STREAMING
                await run.stop()
        finally:
            server.stop()


@pytest.mark.parametrize("pinned", [False, True])
async def test_revisions_change_only_at_an_episode_boundary_and_never_when_pinned(tmp_path: Path, pinned: bool) -> None:
    async with router() as router_port:
        old = await anyio.to_thread.run_sync(start_server, replica_manifest(tmp_path / "a", router_port, "a"))
        new = await anyio.to_thread.run_sync(
            start_server, replica_manifest(tmp_path / "b", router_port, "b", revision="v2")
        )
        try:
            config = edge_config(
                router_port,
                app="fleet",
                max_offline_s=120.0,
                revision="v1" if pinned else "",
                replica="a",  # start on v1 whatever the placement
            )
            engine = RemoteEngine(config, small_sim().spec())
            async with running_edge(small_sim(), engine) as run:
                await eventually(lambda: engine.chunks_received >= 3, 15, "streaming on v1")
                any_replica = msgspec.structs.replace(config.server, replica="")
                engine.config = msgspec.structs.replace(config, server=any_replica)  # from now on: any replica
                old.kill()  # mid-episode: only v2 is left
                await eventually(lambda: engine.state is EngineState.RECONNECTING, 5, "RECONNECTING")
                epoch = engine._epoch
                # Positive control: two more attempts saw v2 (it was up all along) and took nothing.
                await eventually(lambda: engine._epoch >= epoch + 2, 10, "two reconnect attempts")
                assert engine.session is None
                engine.reset()  # the episode boundary
                if pinned:
                    epoch = engine._epoch
                    await eventually(lambda: engine._epoch >= epoch + 2, 10, "two attempts after the reset")
                    assert engine.session is None
                else:
                    chunks = engine.chunks_received
                    await eventually(lambda: engine.chunks_received > chunks, 10, "a chunk from v2")
                    assert engine.server is not None
                    assert engine.server.status.policy.revision == "v2"
                    assert engine.state is EngineState.STREAMING
                await run.stop()
        finally:
            old.stop()
            new.stop()


async def test_edges_settle_onto_a_replica_that_appears_without_a_reconnect(tmp_path: Path) -> None:
    async with router() as router_port:
        manifests = {name: replica_manifest(tmp_path / name, router_port, name) for name in "ab"}
        servers = {"a": await anyio.to_thread.run_sync(start_server, manifests["a"])}
        try:
            edges = [fleet_edge(router_port) for _ in range(3)]
            async with contextlib.AsyncExitStack() as stack:
                for engine, _ in edges:
                    await stack.enter_async_context(running_edge(small_sim(), engine))
                engines = [engine for engine, _ in edges]
                await eventually(lambda: all(e.chunks_received >= 2 for e in engines), 20, "three edges on a")
                assert {serving_replica(e) for e in engines} == {"a"}
                servers["b"] = await anyio.to_thread.run_sync(start_server, manifests["b"])

                def on(replica: str) -> int:
                    return sum(e.session is not None and serving_replica(e) == replica for e in engines)

                # Placement's rule: nobody moves once the replicas hold 2 and 1.
                await eventually(lambda: on("a") == 2 and on("b") == 1, 20, "one edge on b")
                mover = next(e for e, _ in edges if serving_replica(e) == "b")
                log = next(log for e, log in edges if e is mover)
                assert mover.session is not None
                session_id = mover.session.session_id
                await eventually(lambda: any(m.session_id == session_id for m in log.merges), 10, "a chunk from b")
                # A move, not a loss: no reconnect, and the edge streamed on its queue meanwhile.
                assert [e.failsafe.reconnects for e in engines] == [0, 0, 0]
                assert "reconnecting" not in [t.state.value for t in mover.failsafe.transitions]
        finally:
            for server in servers.values():
                server.stop()
