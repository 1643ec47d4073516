"""JointCache: JointState messages by name into the policy's order, ages on the edge's clock."""

from __future__ import annotations

import math

import numpy as np

from servo.robots.ros2.joint_cache import JointCache

S = 1_000_000_000


def test_partial_messages_in_any_order_with_extra_joints() -> None:
    cache = JointCache(["shoulder", "elbow", "gripper"], [1.0, 1.0, 1000.0])
    cache.update(["elbow", "head", "shoulder"], [0.2, 9.0, 0.1], 1 * S)
    assert cache.missing() == ["gripper"]
    cache.update(["gripper"], [0.03], 2 * S)  # the gripper has a driver of its own
    assert cache.missing() == []
    np.testing.assert_allclose(cache.state(), [0.1, 0.2, 30.0], rtol=1e-6)
    assert cache.stalest(3 * S) == ("shoulder", 2.0)


def test_non_finite_values_and_malformed_messages_are_no_reading() -> None:
    cache = JointCache(["a", "b"], [1.0, 1.0])
    cache.update(["a", "b"], [1.0, 2.0], 1 * S)
    cache.update(["a", "b"], [math.nan, 3.0], 5 * S)  # a driver that does not know a's position
    cache.update(["a", "b"], [4.0], 6 * S)  # fewer positions than names
    np.testing.assert_array_equal(cache.state(), [1.0, 3.0])
    assert cache.stalest(7 * S) == ("a", 6.0)
    assert cache.malformed == 1


def test_never_seen_is_infinitely_old_and_name_lists_stay_bounded() -> None:
    cache = JointCache(["a"], [1.0])
    assert cache.stalest(S) == ("a", math.inf)
    for i in range(1000):  # a publisher that invents names: memory does not grow with them
        cache.update([f"x{i}", "a"], [0.0, float(i)], i)
    assert len(cache._layouts) <= 64
    assert cache.state()[0] == 999.0
