"""The ROS 2 tests' fixtures (`tests.robots.ros2.fixtures`); skipped without servo-robotics[ros2]."""

import pytest

pytest.importorskip("cyclonedds")

from tests.robots.ros2.fixtures import ros_env, zenoh_env

__all__ = ["ros_env", "zenoh_env"]
