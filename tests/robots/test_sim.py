from __future__ import annotations

import gc
import subprocess
import sys
import threading
from collections.abc import Iterator

import numpy as np
import pytest
import simplejpeg
from hypothesis import given, settings
from hypothesis import strategies as st

from servo.config import ConfigError
from servo.robots import Robot, SimCameraConfig, SimCameras, SimConfig, SimSO100, make_robot
from servo.robots.sim import SimJoints, first_order_step
from servo.robots.sim_render import ArmRenderer, view_for
from servo.robots.so100_joints import JOINT_NAMES, LOWER, MAX_VELOCITY, REST_POSE, UPPER
from tests.support import new_threads

VMAX = np.asarray(MAX_VELOCITY)
SMALL = SimCameraConfig("front", height=120, width=160, fps=60.0)


@pytest.fixture
def sim() -> Iterator[SimSO100]:
    robot = SimSO100(SimConfig(cameras=(), realtime=False))
    robot.connect()
    yield robot
    robot.disconnect()


def cam_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("servo-cam-")]


def test_spec_uses_lerobot_names_and_units() -> None:
    spec = SimSO100(SimConfig()).spec
    assert isinstance(SimSO100(SimConfig(cameras=())), Robot)
    assert spec.joint_names == JOINT_NAMES
    assert spec.joint_names == (
        "shoulder_pan.pos",
        "shoulder_lift.pos",
        "elbow_flex.pos",
        "wrist_flex.pos",
        "wrist_roll.pos",
        "gripper.pos",
    )
    assert (spec.lower[5], spec.upper[5]) == (0.0, 100.0)
    # LeRobot's so100_follower with use_degrees=True (its default since 0.4).
    assert spec.units == ("degrees",) * 5 + ("range_0_100",)
    assert set(spec.cameras) == {"front", "wrist"}
    assert (spec.cameras["front"].height, spec.cameras["front"].width) == (480, 640)
    assert spec.fps == 30.0


def test_converges_to_target_within_velocity_limit(sim: SimSO100) -> None:
    target = np.array([60.0, 30.0, -40.0, 20.0, 90.0, 80.0], dtype=np.float32)
    sim.send_action(target)
    dt = 0.005
    previous = sim.position
    for _ in range(int(3.0 / dt)):
        sim.step(dt)
        now = sim.position
        assert np.all(np.abs(now - previous) <= VMAX * dt + 1e-9)
        previous = now
    np.testing.assert_allclose(sim.read_state(), target, atol=1e-3)


def test_far_target_moves_at_the_limit_then_decays(sim: SimSO100) -> None:
    start = sim.position
    target = start.copy()
    target[0] = start[0] + 100.0
    sim.send_action(target.astype(np.float32))
    sim.step(0.2)  # saturated phase: exactly v_max * dt
    assert sim.position[0] - start[0] == pytest.approx(VMAX[0] * 0.2)
    # Near the target the lag is first order: error shrinks by e^-1 per time constant.
    sim.step(1.0)
    error = target[0] - sim.position[0]
    sim.step(0.075)
    assert target[0] - sim.position[0] == pytest.approx(error * np.exp(-1.0), rel=1e-6)


@settings(max_examples=50, deadline=None)
@given(
    st.floats(-300, 300),
    st.floats(-300, 300),
    st.floats(0.0, 2.0),
    st.integers(1, 40),
)
def test_dynamics_do_not_depend_on_the_loop_rate(x0: float, goal: float, total: float, n: int) -> None:
    pos, target, vmax = np.array([x0]), np.array([goal]), np.array([150.0])
    once = first_order_step(pos, target, total, 0.075, vmax)
    sliced = pos
    for _ in range(n):
        sliced = first_order_step(sliced, target, total / n, 0.075, vmax)
    np.testing.assert_allclose(sliced, once, atol=1e-9)


def test_targets_are_clamped_to_joint_limits(sim: SimSO100) -> None:
    sim.send_action(np.array([999, -999, 999, -999, 999, 999], dtype=np.float32))
    sim.step(10.0)
    expected = [UPPER[0], LOWER[1], UPPER[2], LOWER[3], UPPER[4], UPPER[5]]
    np.testing.assert_allclose(sim.read_state(), expected, atol=1e-6)


def test_bad_targets_and_unconnected_use_are_errors() -> None:
    robot = SimSO100(SimConfig(cameras=()))
    with pytest.raises(RuntimeError, match="before connect"):
        robot.read_state()
    robot.connect()
    with pytest.raises(ValueError, match="shape"):
        robot.send_action(np.zeros(3, dtype=np.float32))
    with pytest.raises(ValueError, match="non-finite"):
        robot.send_action(np.full(6, np.inf, dtype=np.float32))
    with pytest.raises(ValueError, match="dt"):
        robot.step(-1.0)
    robot.disconnect()


def test_realtime_mode_advances_with_the_clock() -> None:
    robot = SimSO100(SimConfig(cameras=(), time_constant_s=0.01))
    with robot:
        target = np.asarray(REST_POSE, dtype=np.float32)
        target[5] = 6.0
        robot.send_action(target)
        # Advance real time by waiting on an event that never fires, not by sleeping.
        threading.Event().wait(0.1)
        assert robot.read_state()[5] == pytest.approx(6.0, abs=1e-3)


def test_noise_is_seeded() -> None:
    reads = []
    for _ in range(2):
        with SimSO100(SimConfig(cameras=(), noise_std=0.5, seed=7, realtime=False)) as robot:
            reads.append(np.stack([robot.read_state() for _ in range(200)]))
    np.testing.assert_array_equal(reads[0], reads[1])
    assert reads[0].std(axis=0) == pytest.approx(np.full(6, 0.5), rel=0.2)


def test_config_validation() -> None:
    with pytest.raises(ValueError, match="time_constant_s"):
        SimConfig(time_constant_s=0)
    with pytest.raises(ValueError, match="initial_pose is outside"):
        SimConfig(initial_pose=(0, 0, 0, 0, 0, 120))
    with pytest.raises(ValueError, match="unique"):
        SimConfig(cameras=(SimCameraConfig("a"), SimCameraConfig("a")))


def test_camera_frames_have_configured_shape_and_follow_the_arm() -> None:
    config = SimConfig(cameras=(SMALL, SimCameraConfig("wrist", height=90, width=200, fps=60.0)), realtime=False)
    with SimSO100(config) as robot:
        cameras = SimCameras(config, robot)  # in one process the arm is its cameras' pose source
        cameras.connect()
        frames = cameras.read_cameras()
        assert set(frames) == {"front", "wrist"}
        assert frames["front"].shape == (120, 160, 3)
        assert frames["wrist"].shape == (90, 200, 3)
        assert frames["front"].dtype == np.uint8
        assert not frames["front"].flags.writeable
        before = cameras.wait_for_frames()
        robot.send_action(np.array([60, 40, -30, 20, 90, 90], dtype=np.float32))
        robot.step(2.0)
        after = cameras.wait_for_frames()
        for name in ("front", "wrist"):
            changed = np.any(before[name] != after[name], axis=2).mean()
            assert changed > 0.01, name
        # A still arm renders the same picture again: frames depend only on the pose.
        np.testing.assert_array_equal(cameras.wait_for_frames()["front"], after["front"])
        cameras.disconnect()


def test_cameras_render_the_published_pose_before_the_first_one_the_initial_pose() -> None:
    class Board:
        pose: np.ndarray | None = None

        def latest_pose(self) -> np.ndarray | None:
            return self.pose

    board = Board()
    config = SimConfig(cameras=(SMALL,))
    cameras = SimCameras(config, board)
    cameras.connect()
    try:
        initial = cameras.wait_for_frames()["front"]
        np.testing.assert_array_equal(initial, ArmRenderer(120, 160, view_for("front", 0)).render(config.initial_pose))
        board.pose = np.array([60, 40, -30, 20, 90, 90], dtype=np.float32)
        moved = cameras.wait_for_frames()["front"]
        np.testing.assert_array_equal(moved, ArmRenderer(120, 160, view_for("front", 0)).render(board.pose))
    finally:
        cameras.disconnect()


def test_frames_are_rgb() -> None:
    # The front view has the blue-grey wall at the top and the orange-brown table at the bottom:
    # a BGR mix-up would swap which end is blue.
    frame = ArmRenderer(480, 640, view_for("front", 0)).render(REST_POSE).astype(int)
    top, bottom = frame[:20].mean(axis=(0, 1)), frame[-20:].mean(axis=(0, 1))
    assert top[2] > top[0] + 10
    assert bottom[0] > bottom[2] + 30


def test_jpeg_size_is_camera_like() -> None:
    renderer = ArmRenderer(480, 640, view_for("front", 0))
    for pose in (REST_POSE, (30, 20, -30, 10, 45, 80)):
        size = len(simplejpeg.encode_jpeg(renderer.render(pose), quality=90, colorspace="RGB"))
        assert 10_000 < size < 150_000


def test_connect_disconnect_stop_the_threads() -> None:
    before = set(threading.enumerate())
    config = SimConfig(cameras=(SMALL, SimCameraConfig("side", 60, 80, fps=60.0)))
    cameras = SimCameras(config, SimSO100(config))
    cameras.connect()
    assert len(cam_threads()) == 2
    assert new_threads(before) == sorted(t.name for t in cam_threads())
    cameras.disconnect()
    cameras.disconnect()
    assert new_threads(before) == []
    assert cam_threads() == []


def test_forgotten_cameras_stop_their_threads_when_collected() -> None:
    config = SimConfig(cameras=(SMALL,))
    cameras = SimCameras(config, SimSO100(config))
    cameras.connect()
    threads = cam_threads()
    assert len(threads) == 1
    del cameras
    gc.collect()
    threads[0].join(timeout=2.0)
    assert not threads[0].is_alive()


def test_forgotten_connected_robot_does_not_block_interpreter_exit() -> None:
    # Module globals outlive the thread join at shutdown, so only the exit hook can stop these.
    code = (
        "from servo.robots import SimCameraConfig, SimCameras, SimConfig, SimSO100\n"
        "config = SimConfig(cameras=(SimCameraConfig('front', 60, 80),))\n"
        "cameras = SimCameras(config, SimSO100(config))\n"
        "cameras.connect()\n"
        "print('connected', flush=True)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30, check=True)
    assert "connected" in done.stdout


def test_a_sim_of_the_policys_joints_has_their_names_units_and_ranges() -> None:
    names = tuple(f"joint_{i}" for i in range(7))
    units = ("radians",) * 6 + ("meters",)
    robot = make_robot("sim", {"joints": ",".join(names), "units": ",".join(units), "cameras": "front:48x64"})
    spec = robot.spec
    assert (spec.joint_names, spec.units) == (names, units)
    assert spec.lower[0] == pytest.approx(-np.pi)
    assert spec.upper[6] == 1.0
    assert spec.rest_pose == (0.0,) * 7
    with robot:
        target = np.array([1.0, -1.0, 0.5, 0, 0, 0, 0.5], dtype=np.float32)
        robot.send_action(np.full(7, 100.0, dtype=np.float32))  # clamped to the joints' ranges
        np.testing.assert_allclose(robot.target, [np.pi] * 6 + [1.0])
        robot.send_action(target)
        np.testing.assert_allclose(robot.target, target, rtol=1e-6)
        assert robot.read_state().shape == (7,)
    # Its cameras draw the SO-100 posed from those joints: a different pose, a different frame.
    config = SimConfig(cameras=(SMALL,), joints=SimJoints.generic(names, units), realtime=False)
    drawn = [config.joints.drawn_pose(pose) for pose in (np.zeros(7), np.full(7, 1.0))]
    assert all(d.shape == (6,) for d in drawn)
    assert not np.allclose(drawn[0], drawn[1])
    assert make_robot("sim", {"joints": "a,b", "units": "degrees"}).spec.units == ("degrees", "degrees")
    with pytest.raises(ConfigError, match=r"units = .*: needs one, or one per joint of joints \(2\)"):
        make_robot("sim", {"joints": "a,b", "units": "degrees,degrees,meters"})
    # The SO-100's own names stay the SO-100.
    assert make_robot("sim", {"joints": ",".join(JOINT_NAMES)}).spec == SimSO100(SimConfig()).spec
