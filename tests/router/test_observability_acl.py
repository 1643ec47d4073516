"""The router's access control for fleet observability: robot telemetry and the audit queryable.

Telemetry: robot R alone may put on ``@servo/@robots/R/telemetry``; monitors read every robot's.
Audit: servers answer ``<p>/audit``, only monitors may ask. Each test runs under mTLS,
user/password over TCP and user/password over TLS, and asserts "never arrives" only after a
positive control (see harness).
"""

from __future__ import annotations

import pytest
import zenoh

from servo.wire import TELEMETRY_SELECTOR, ServerKeys, telemetry_key
from tests.router.harness import FakeServer, Inbox, Net, replies, wait_matching

KEYS = ServerKeys("lab", "act", "r1")
T7, T8 = telemetry_key("robot-7"), telemetry_key("robot-8")


@pytest.fixture
def server(net: Net) -> FakeServer:
    fake = FakeServer(net.join("gpu-0"), KEYS)
    net.wait_token(KEYS.alive)
    return fake


def telemetry_publisher(z: zenoh.Session, key: str) -> zenoh.Publisher:
    """At telemetry's priority (the router keeps order per priority); blocking, so a positive
    control is never lost to a busy host."""
    return z.declare_publisher(key, priority=zenoh.Priority.DATA_LOW, congestion_control=zenoh.CongestionControl.BLOCK)


def test_a_monitor_reads_every_robots_telemetry_and_nobody_else_writes_it(net: Net) -> None:
    monitor, seen = net.join("dashboard"), Inbox()
    monitor.declare_subscriber(TELEMETRY_SELECTOR, seen.samples())
    r7, r8, gpu = net.join("robot-7"), net.join("robot-8"), net.join("gpu-0")

    own = telemetry_publisher(r7, T7)
    wait_matching(own)  # robot-7 sees the monitor's subscriber
    own.put(b"r7-1")
    seen.wait_for((T7, b"r7-1"))

    forged_by_8 = telemetry_publisher(r8, T7)
    forged_by_server = telemetry_publisher(gpu, T7)
    net.join("dashboard").put(T7, b"by-monitor")  # another monitor session (its own would deliver locally)
    forged_by_8.put(b"by-robot-8")
    forged_by_server.put(b"by-server")
    control = telemetry_publisher(r8, T8)
    wait_matching(control)
    control.put(b"r8-1")  # positive control: robot-8's own record, sent after its forgery
    own.put(b"r7-2")
    seen.wait_for((T8, b"r8-1"))
    seen.wait_for((T7, b"r7-2"))
    assert sorted(seen.items) == sorted([(T7, b"r7-1"), (T8, b"r8-1"), (T7, b"r7-2")])


def test_robots_and_servers_cannot_read_telemetry(net: Net) -> None:
    monitor, seen_by_monitor = net.join("dashboard"), Inbox()
    monitor.declare_subscriber(TELEMETRY_SELECTOR, seen_by_monitor.samples())
    r8, gpu, snooped = net.join("robot-8"), net.join("gpu-0"), Inbox()
    r8.declare_subscriber(TELEMETRY_SELECTOR, snooped.samples())  # denied: the router never hears of it
    r8.declare_subscriber(T7, snooped.samples())
    gpu.declare_subscriber(TELEMETRY_SELECTOR, snooped.samples())
    r7 = net.join("robot-7")
    publisher = telemetry_publisher(r7, T7)
    wait_matching(publisher)
    for n in range(3):
        publisher.put(f"r7-{n}".encode())
    seen_by_monitor.wait_for((T7, b"r7-2"))
    # The snoopers' declarations were sent before robot-7 joined and published.
    assert snooped.items == []


def test_only_a_monitor_may_ask_a_replica_for_its_recent_requests(net: Net, server: FakeServer) -> None:
    r7 = net.join("robot-7")
    assert replies(r7, "@servo/*/*/*/audit") == []
    assert replies(r7, KEYS.audit) == []
    monitor = net.join("dashboard")
    assert replies(monitor, "@servo/*/*/*/audit") == [(KEYS.audit, b"r1")]
    assert server.queries.items == ["@servo/*/*/*/audit"]


def test_only_servers_may_answer_audit_queries(net: Net) -> None:
    r7 = net.join("robot-7")
    posing, reached = ServerKeys("lab", "act", "fake"), Inbox()
    r7.declare_queryable(posing.audit, reached.handler(lambda q: str(q.key_expr)))
    real = FakeServer(net.join("gpu-0"), KEYS)
    net.wait_token(KEYS.alive)
    monitor = net.join("dashboard")
    # Positive control: the real server's audit queryable, declared after the robot's, answers.
    assert replies(monitor, "@servo/*/*/*/audit") == [(KEYS.audit, b"r1")]
    assert real.queries.items == ["@servo/*/*/*/audit"]
    assert reached.items == []
