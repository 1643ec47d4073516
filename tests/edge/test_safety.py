"""SafetyLimiter: joint limits and the slew-rate limit, the last gate before the motors."""

from __future__ import annotations

import numpy as np
import pytest

from servo.edge.safety import SafetyLimiter, UnsafeTarget
from servo.robots.protocol import RobotSpec

SPEC = RobotSpec(
    name="test",
    fps=10.0,
    joint_names=("a.pos", "b.pos"),
    cameras={},
    lower=(-10.0, 0.0),
    upper=(10.0, 100.0),
    max_velocity=(5.0, 50.0),  # per tick at 10 fps: 0.5 and 5.0
    rest_pose=(0.0, 0.0),
)


def f32(*values: float) -> np.ndarray:
    return np.array(values, dtype=np.float32)


def test_joint_limits_without_anchor() -> None:
    limiter = SafetyLimiter(SPEC)
    out = limiter.apply(f32(25.0, -3.0))
    assert out.tolist() == [10.0, 0.0]
    assert out.dtype == np.float32
    assert limiter.clamped_ticks == 1


def test_slew_per_tick_is_max_velocity_over_fps() -> None:
    limiter = SafetyLimiter(SPEC)
    limiter.start_from(f32(0.0, 0.0))
    out = limiter.apply(f32(3.0, -1.0))
    np.testing.assert_allclose(out, [0.5, 0.0])  # b clamped to its lower limit first
    assert limiter.slewed_ticks == 1
    inside = limiter.apply(f32(0.75, 2.0))  # within one step of the last command: exact
    np.testing.assert_allclose(inside, [0.75, 2.0])
    assert limiter.slewed_ticks == 1


def test_a_jump_becomes_a_ramp() -> None:
    limiter = SafetyLimiter(SPEC)
    limiter.start_from(f32(-8.0, 10.0))
    target = f32(8.0, 90.0)
    ramp = [limiter.apply(target) for _ in range(40)]
    steps = np.abs(np.diff(np.vstack([f32(-8.0, 10.0), *ramp]), axis=0))
    assert np.all(steps <= limiter.max_step + 1e-5)
    assert steps[0].tolist() == pytest.approx([0.5, 5.0])
    np.testing.assert_allclose(ramp[31], target)  # 16 / 0.5 = 32 ticks for the slow joint
    assert not np.allclose(ramp[30], target)


def test_anchor_is_clipped_into_the_limits() -> None:
    limiter = SafetyLimiter(SPEC)
    limiter.start_from(f32(12.0, 50.0))  # a measured pose slightly outside the limits
    out = limiter.apply(f32(12.0, 50.0))
    np.testing.assert_allclose(out, [10.0, 50.0])


def test_velocity_scale() -> None:
    limiter = SafetyLimiter(SPEC, velocity_scale=0.5)
    limiter.start_from(f32(0.0, 0.0))
    np.testing.assert_allclose(limiter.apply(f32(5.0, 50.0)), [0.25, 2.5])
    with pytest.raises(ValueError, match="velocity_scale"):
        SafetyLimiter(SPEC, velocity_scale=0.0)


@pytest.mark.parametrize(
    ("target", "message"),
    [
        ([np.nan, 1.0], r"target has non-finite values \[nan, 1.0\]"),
        ([1.0, np.inf], "non-finite"),
        ([-np.inf, 0.0], "non-finite"),
        ([1.0, 2.0, 3.0], r"target has shape \(3,\), expected \(2,\)"),
    ],
)
def test_unsafe_targets_are_refused_and_the_last_command_holds(target: list[float], message: str) -> None:
    limiter = SafetyLimiter(SPEC)
    limiter.start_from(f32(1.0, 2.0))
    held = limiter.apply(f32(1.2, 2.5))
    with pytest.raises(UnsafeTarget, match=message):
        limiter.apply(np.array(target, dtype=np.float32))
    assert limiter.last is not None
    assert limiter.last.tolist() == held.tolist()
    np.testing.assert_allclose(limiter.apply(f32(1.2, 2.5)), held)  # carries on from the held command


def test_a_non_finite_anchor_never_becomes_a_command() -> None:
    limiter = SafetyLimiter(SPEC)
    limiter.start_from(f32(np.nan, 0.0))  # a sensor glitch at start
    with pytest.raises(UnsafeTarget, match="command would be non-finite"):
        limiter.apply(f32(0.0, 0.0))
