"""The router's access control, member by member, with real credentials (certificates generated in
the test, or passwords) and real client-mode sessions. Each test runs under mTLS, under
user/password over TCP, and under user/password over TLS.

"Never arrives" is asserted only after a positive control (see harness): a message that is
allowed, sent later over the same link, has arrived.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import zenoh

from servo.transport import TlsSettings, UsrPwdSettings, ZenohSettings
from servo.wire import ServerKeys
from tests.pki import Pki
from tests.router.harness import FakeServer, Inbox, Net, action_publisher, obs_publisher, replies, tokens, wait_matching

KEYS = ServerKeys("lab", "act", "r1")
ROBOT7, ROBOT8 = KEYS.client("robot-7"), KEYS.client("robot-8")


@pytest.fixture
def server(net: Net) -> FakeServer:
    fake = FakeServer(net.join("gpu-0"), KEYS)
    net.wait_token(KEYS.alive)
    return fake


def test_a_robot_does_everything_it_needs(net: Net, server: FakeServer) -> None:
    r7 = net.join("robot-7")
    # Queried before the liveliness subscriber below: in zenoh 1.10.2 a liveliness query from a
    # session that has just subscribed to the same tokens often comes back empty, router or not.
    assert tokens(r7, "@servo/*/*/*/alive") == [KEYS.alive]
    chunks = Inbox()
    r7.declare_subscriber(ROBOT7.action, chunks.samples())
    net.token(r7, ROBOT7.alive)
    servers = Inbox()
    r7.liveliness().declare_subscriber(KEYS.alive, servers.tokens(), history=True)

    obs = obs_publisher(r7, ROBOT7.obs)
    wait_matching(obs)  # the server's c/*/obs subscriber is visible to the robot
    obs.put(b"obs-1")
    server.obs.wait_for((ROBOT7.obs, b"obs-1"))

    action = action_publisher(server.z, ROBOT7.action)
    wait_matching(action)
    action.put(b"chunk-1")
    chunks.wait_for((ROBOT7.action, b"chunk-1"))

    server.clients.wait_for(("put", ROBOT7.alive))
    servers.wait_for(("put", KEYS.alive))
    assert replies(r7, "@servo/*/*/*/status") == [(KEYS.status, b"r1")]
    assert replies(r7, KEYS.session) == [(KEYS.session, b"r1")]
    assert replies(r7, KEYS.trajectory) == [(KEYS.trajectory, b"r1")]
    assert replies(r7, ROBOT7.control) == [(ROBOT7.control, b"r1")]


def test_a_robot_cannot_feed_another_robots_session(net: Net, server: FakeServer) -> None:
    r8 = net.join("robot-8")
    forged = obs_publisher(r8, ROBOT7.obs)
    wait_matching(forged)  # robot-8 sees the server's c/*/obs subscriber, so the put leaves robot-8
    forged.put(b"forged")
    own = obs_publisher(r8, ROBOT8.obs)
    wait_matching(own)
    own.put(b"own")  # positive control: same link, same priority, sent after the forged one
    assert server.obs.wait_for((ROBOT8.obs, b"own")) == [(ROBOT8.obs, b"own")]


def test_a_robot_cannot_read_another_robots_chunks(net: Net, server: FakeServer) -> None:
    r7, r8 = net.join("robot-7"), net.join("robot-8")
    seen_by_7, seen_by_8 = Inbox(), Inbox()
    r7.declare_subscriber(ROBOT7.action, seen_by_7.samples())
    r8.declare_subscriber(ROBOT7.action, seen_by_8.samples())  # denied: the router never hears of it
    r8.declare_subscriber("@servo/*/*/*/c/*/action", seen_by_8.samples())  # wider than allowed: denied
    r8.declare_subscriber(ROBOT8.action, seen_by_8.samples())

    to_7, to_8 = action_publisher(server.z, ROBOT7.action), action_publisher(server.z, ROBOT8.action)
    wait_matching(to_7)
    wait_matching(to_8)
    to_7.put(b"chunk-for-7")
    to_8.put(b"chunk-for-8")
    seen_by_7.wait_for((ROBOT7.action, b"chunk-for-7"))
    # (The wide subscriber may get robot-8's own chunk: the session hands a sample to every
    # local subscriber that matches it.)
    assert (ROBOT7.action, b"chunk-for-7") not in seen_by_8.wait_for((ROBOT8.action, b"chunk-for-8"))


def test_a_robot_cannot_read_another_robots_observations(net: Net, server: FakeServer) -> None:
    r7, r8 = net.join("robot-7"), net.join("robot-8")
    sniffed = Inbox()
    r8.declare_subscriber(ROBOT7.obs, sniffed.samples())  # denied
    r8.declare_subscriber(KEYS.all_obs, sniffed.samples())  # posing as the server: denied
    r8.declare_subscriber(ROBOT8.action, sniffed.samples())
    # Observation priority, so it queues behind anything the router forwarded to robot-8 before.
    marker = obs_publisher(server.z, ROBOT8.action)
    wait_matching(marker)  # robot-8's declarations have all been handled by the router
    obs = obs_publisher(r7, ROBOT7.obs)
    wait_matching(obs)
    obs.put(b"obs")
    server.obs.wait_for((ROBOT7.obs, b"obs"))
    marker.put(b"marker")
    assert sniffed.wait_for((ROBOT8.action, b"marker")) == [(ROBOT8.action, b"marker")]


def test_a_robot_cannot_publish_chunks_to_another_robot(net: Net, server: FakeServer) -> None:
    r7, r8 = net.join("robot-7"), net.join("robot-8")
    chunks = Inbox()
    r7.declare_subscriber(ROBOT7.action, chunks.samples())
    legit = action_publisher(server.z, ROBOT7.action)
    wait_matching(legit)

    forged = action_publisher(r8, ROBOT7.action)
    # The router announced robot-7's subscriber to the server (matched above) and never to
    # robot-8, so robot-8's own session drops the puts; the router would drop them too.
    assert not forged.matching_status.matching
    r8.put(ROBOT7.action, b"forged", priority=zenoh.Priority.INTERACTIVE_HIGH, express=True)
    forged.put(b"forged")
    after = obs_publisher(r8, ROBOT8.obs)
    wait_matching(after)
    after.put(b"after-forging")
    # The router handled the forged puts before this observation; the server's chunk is queued
    # to robot-7 after anything the router forwarded for them.
    server.obs.wait_for((ROBOT8.obs, b"after-forging"))
    legit.put(b"chunk")
    assert chunks.wait_for((ROBOT7.action, b"chunk")) == [(ROBOT7.action, b"chunk")]


def test_a_robot_cannot_query_or_control_another_robot(net: Net, server: FakeServer) -> None:
    r8 = net.join("robot-8")
    assert replies(r8, ROBOT7.control) == []
    assert replies(r8, "@servo/*/*/*/c/*/control") == []
    assert replies(r8, ROBOT8.control) == [(ROBOT8.control, b"r1")]
    assert server.queries.items == [ROBOT8.control]


def test_a_robot_cannot_declare_another_robots_liveliness(net: Net, server: FakeServer) -> None:
    r8 = net.join("robot-8")
    net.token(r8, ROBOT7.alive)
    net.token(r8, ROBOT8.alive)
    assert server.clients.wait_for(("put", ROBOT8.alive)) == [("put", ROBOT8.alive)]


def test_a_robot_cannot_pose_as_a_server(net: Net, server: FakeServer) -> None:
    r7, r8 = net.join("robot-7"), net.join("robot-8")
    rogue = ServerKeys("lab", "act", "rogue")
    reached = Inbox()
    for key in (rogue.status, rogue.session, KEYS.status, ROBOT7.control):
        r8.declare_queryable(key, reached.handler(lambda q: str(q.key_expr)))
    net.token(r8, rogue.alive)
    net.token(r8, KEYS.alive)
    r8.declare_subscriber(KEYS.all_obs, reached.samples())
    # Positive control: robot-8's own token, declared last, reached the server.
    net.token(r8, ROBOT8.alive)
    server.clients.wait_for(("put", ROBOT8.alive))

    assert replies(r7, "@servo/*/*/*/status") == [(KEYS.status, b"r1")]
    assert replies(r7, rogue.session) == []
    assert replies(r7, ROBOT7.control) == [(ROBOT7.control, b"r1")]
    assert tokens(r7, "@servo/*/*/*/alive") == [KEYS.alive]
    obs = obs_publisher(r7, ROBOT7.obs)
    wait_matching(obs)
    obs.put(b"obs")
    server.obs.wait_for((ROBOT7.obs, b"obs"))
    assert replies(r7, KEYS.status) == [(KEYS.status, b"r1")]  # after the obs, on robot-7's link
    assert reached.items == []


def test_a_server_limited_to_an_app_stays_in_it(net: Net, server: FakeServer) -> None:
    gpu_k = net.join("gpu-k")
    outside = ServerKeys("lab", "act", "k2")
    gpu_k.declare_queryable(outside.status, lambda q: q.reply(outside.status, b"k2"))
    net.token(gpu_k, outside.alive)
    stolen = Inbox()
    gpu_k.declare_subscriber(ROBOT7.obs, stolen.samples())
    kitchen = FakeServer(gpu_k, ServerKeys("kitchen", "act", "k1"))
    net.wait_token(kitchen.keys.alive)
    r7 = net.join("robot-7")
    # Positive control: the kitchen server's own token, declared last, is visible.
    found = tokens(r7, "@servo/*/*/*/alive")
    assert found == sorted([KEYS.alive, kitchen.keys.alive])
    assert sorted(replies(r7, "@servo/*/*/*/status")) == sorted([(KEYS.status, b"r1"), (kitchen.keys.status, b"k1")])
    obs = obs_publisher(r7, ROBOT7.obs)
    wait_matching(obs)
    obs.put(b"lab-obs")
    server.obs.wait_for((ROBOT7.obs, b"lab-obs"))
    kitchen_obs = obs_publisher(r7, kitchen.keys.client("robot-7").obs)
    wait_matching(kitchen_obs)
    kitchen_obs.put(b"kitchen-obs")
    kitchen.obs.wait_for((kitchen.keys.client("robot-7").obs, b"kitchen-obs"))
    assert stolen.items == []
    assert kitchen.obs.items == [(kitchen.keys.client("robot-7").obs, b"kitchen-obs")]


def test_a_monitor_reads_and_cannot_write(net: Net, server: FakeServer) -> None:
    r7, mon = net.join("robot-7"), net.join("dashboard")
    net.token(r7, ROBOT7.alive)
    server.clients.wait_for(("put", ROBOT7.alive))
    seen = Inbox()
    mon.declare_subscriber("@servo/*/*/*/c/*/obs", seen.samples())

    assert replies(mon, "@servo/*/*/*/status") == [(KEYS.status, b"r1")]
    assert tokens(mon, "@servo/*/*/*/alive") == [KEYS.alive]
    assert tokens(mon, "@servo/*/*/*/c/*/alive") == [ROBOT7.alive]
    obs = obs_publisher(r7, ROBOT7.obs)
    wait_matching(obs)
    obs.put(b"obs")
    seen.wait_for((ROBOT7.obs, b"obs"))

    mon.put(ROBOT7.obs, b"forged-obs")
    mon.put(ROBOT7.action, b"forged-chunk")
    reached = Inbox()
    posing = ServerKeys("lab", "act", "monitor")
    mon.declare_queryable(posing.status, reached.handler(lambda q: str(q.key_expr)))
    net.token(mon, posing.alive)
    net.token(mon, KEYS.client("robot-9").alive)
    assert replies(mon, KEYS.session) == []
    assert replies(mon, ROBOT7.control) == []
    # Positive control: a status query sent after all of the above reached the server.
    assert replies(mon, KEYS.status) == [(KEYS.status, b"r1")]
    assert server.queries.items == ["@servo/*/*/*/status", KEYS.status]
    assert replies(r7, "@servo/*/*/*/status") == [(KEYS.status, b"r1")]
    assert tokens(r7, "@servo/*/*/*/alive") == [KEYS.alive]
    assert server.obs.items == [(ROBOT7.obs, b"obs")]
    assert server.clients.items == [("put", ROBOT7.alive)]
    assert reached.items == []


def test_someone_outside_the_fleet_gets_nothing(net: Net, server: FakeServer) -> None:
    stranger = net.join("router-b")  # valid credentials, but no role in this fleet file
    assert replies(stranger, "@servo/*/*/*/status") == []
    assert tokens(stranger, "@servo/*/*/*/alive") == []
    r7 = net.join("robot-7")
    assert replies(r7, "@servo/*/*/*/status") == [(KEYS.status, b"r1")]
    assert server.queries.items == ["@servo/*/*/*/status"]


def test_a_forged_identity_cannot_connect(net: Net, tmp_path: Path) -> None:
    if net.auth == "mtls":
        rogue = Pki(tmp_path / "rogue").issue("robot-7")  # right name, wrong CA
        tls = TlsSettings(
            root_ca_certificate=net.creds.pki.ca,
            connect_certificate=rogue.cert,
            connect_private_key=rogue.key,
            enable_mtls=True,
        )
        settings = ZenohSettings(mode="client", connect=[f"tls/127.0.0.1:{net.port}"], tls=tls)
    else:
        secret = tmp_path / "guess"
        secret.write_text("pw-of-robot-8")
        tls = TlsSettings(root_ca_certificate=net.creds.pki.ca) if net.auth == "tls-usrpwd" else None
        endpoint = f"{'tls' if tls else 'tcp'}/127.0.0.1:{net.port}"
        settings = ZenohSettings(
            mode="client", connect=[endpoint], tls=tls, auth=UsrPwdSettings("robot-7", str(secret))
        )
    with pytest.raises(zenoh.ZError):
        zenoh.open(settings.to_config()).close()
