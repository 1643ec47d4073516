"""DDS isolation for the ROS 2 tests: never the machine's network, never another test's graph.

Every test gets a Cyclone configuration bound to the loopback interface with multicast off and
127.0.0.1 as its only peer (`servo.robots.ros2.dds.loopback_config`, through ``CYCLONEDDS_URI``,
which child processes inherit), a random domain id and a random ROS namespace: tests that run at
the same time on this machine (other engineers' included) may share a domain, never a topic.
"""

from __future__ import annotations

import secrets

import pytest

pytest.importorskip("cyclonedds")

from servo.robots.ros2.dds import loopback_config
from servo.robots.ros2.options import MAX_DOMAIN_ID
from tests.robots.ros2.node import DdsEnv


@pytest.fixture
def dds_env(monkeypatch: pytest.MonkeyPatch) -> DdsEnv:
    env = DdsEnv(
        domain_id=1 + secrets.randbelow(MAX_DOMAIN_ID),
        namespace=f"/servo_test_{secrets.token_hex(4)}",
        uri=loopback_config(),
    )
    monkeypatch.setenv("CYCLONEDDS_URI", env.uri)
    monkeypatch.delenv("ROS_DOMAIN_ID", raising=False)
    return env
