"""A ``--robot ros2`` run becomes a LeRobotDataset like any other robot's: the policy's joint names,
its units, the camera frames from the ROS topic."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("lerobot", minversion="0.5", reason="needs servo-robotics[lerobot] (Python >= 3.12)")
pytest.importorskip("cyclonedds", reason="needs servo-robotics[ros2]")

from servo.edge.remote import RemoteEngine
from servo.edge.runtime import RunOptions
from servo.lerobot_dataset import export_recordings
from servo.recording import read_recording
from servo.robots import RobotDescription
from tests.edge.harness import edge_config, running_edge
from tests.lerobot.test_dataset import load
from tests.robots.ros2.fixtures import ros_env
from tests.robots.ros2.node import POLICY_JOINTS, RosEnv
from tests.support import eventually, make_manifest, running_server

__all__ = ["ros_env"]

CAMERA = "front:cam/image_raw:64x48"
POLICY = (
    "cameras = {front = [48, 64]}\nchunk_size = 20\n"
    f"joint_names = [{', '.join(repr(name) for name in POLICY_JOINTS)}]"
).replace("'", '"')


@pytest.mark.anyio
async def test_a_ros2_run_exports_with_the_policys_joint_names(port: int, ros_env: RosEnv, tmp_path: Path) -> None:
    record = tmp_path / "run.servo"
    node = ros_env.start_node("--camera", CAMERA)
    try:
        manifest = make_manifest(port, options=POLICY, extra='[serving]\ndefault_task = "reach"')
        async with running_server(manifest):
            robot = RobotDescription("ros2", ros_env.robot_options(units="degrees", cameras=CAMERA))
            engine = RemoteEngine(edge_config(port), robot.spec())
            options = RunOptions(record_path=str(record), record_images_every=1)
            async with running_edge(robot, engine, options) as run:
                await eventually(lambda: engine.chunks_received >= 2 and run.runtime.loop is not None, 30, "chunks")
                loop = run.runtime.loop
                await eventually(lambda: loop.statistics().ticks >= 40, 20, "40 ticks")
                await run.stop()
    finally:
        node.stop()
    rec = read_recording(record)
    assert rec.header.robot == "ros2"
    assert rec.header.joint_names == list(POLICY_JOINTS)
    summary = export_recordings([record], root=tmp_path / "ds", repo_id="local/servo_ros2")
    ds = load(tmp_path / "ds", "local/servo_ros2")
    assert summary.frames == len(ds) > 0
    assert ds.meta.robot_type == "ros2"
    assert ds.features["action"]["names"] == list(POLICY_JOINTS)
    item = ds[0]
    assert item["task"] == "reach"
    assert item["observation.images.front"].shape == (3, 48, 64)
    first_command = next(f for f in rec.frames if f.action is not None)
    np.testing.assert_allclose(item["action"].numpy(), rec.actions()[0], atol=1e-6)
    assert first_command.source == "policy"
