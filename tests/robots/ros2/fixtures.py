"""DDS and Zenoh isolation for the ROS 2 tests: never the machine's network, never another test's graph.

Every test gets a Cyclone configuration bound to the loopback interface with multicast off and
127.0.0.1 as its only peer (`servo.robots.ros2.dds.loopback_config`, through ``CYCLONEDDS_URI``,
which child processes inherit), a random domain id and a random ROS namespace: tests that run at
the same time on this machine (other engineers' included) may share a domain, never a topic.
On rmw_zenoh's transport (``zenoh_env``) each test has a router of its own on a free loopback
port, multicast scouting off. Import the fixtures into a test module (or a conftest) to use them.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator

import pytest
import zenoh

from servo.robots.ros2.dds import loopback_config
from servo.robots.ros2.options import MAX_DOMAIN_ID
from servo.transport.config import ZenohSettings
from tests.robots.ros2.node import RosEnv
from tests.support import free_port


@pytest.fixture
def ros_env(monkeypatch: pytest.MonkeyPatch) -> RosEnv:
    env = RosEnv(
        domain_id=1 + secrets.randbelow(MAX_DOMAIN_ID),
        namespace=f"/servo_test_{secrets.token_hex(4)}",
        uri=loopback_config(),
    )
    monkeypatch.setenv("CYCLONEDDS_URI", env.uri)
    monkeypatch.delenv("ROS_DOMAIN_ID", raising=False)
    return env


@pytest.fixture
def zenoh_env(ros_env: RosEnv) -> Iterator[RosEnv]:
    """The same isolation on rmw_zenoh's transport: a Zenoh router of the test's own on 127.0.0.1."""
    endpoint = f"tcp/127.0.0.1:{free_port()}"
    router = zenoh.open(ZenohSettings(mode="router", listen=[endpoint]).to_config())
    try:
        yield ros_env.over_zenoh(endpoint)
    finally:
        router.close()
