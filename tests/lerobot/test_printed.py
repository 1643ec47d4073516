"""What ``servo-serve --lerobot`` prints for checkpoints of other arms, run as printed.

Checkpoints servo has no arm for (7 and 14 joints, a 37-step chunk at 15 fps, cameras of 240x320
and 120x160, as a user's ACT was): no SO-101 command, and the sim's command runs as printed with
the checkpoint's joints, rate and cameras. A Diffusion policy too slow for its chunk is told its
own options (``n_action_steps``, ``num_inference_steps``). A checkpoint without its dataset is
served with ``--action-names``.
"""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("lerobot", minversion="0.5", reason="needs servo-robotics[lerobot] (Python >= 3.12)")

from servo.recording import read_recording
from tests.edge.harness import Proc
from tests.lerobot.checkpoints import build_act, build_diffusion, build_trained_act
from tests.support import free_port

SIZES = {"front": (240, 320), "wrist": (120, 160)}


def serve(checkpoint: Path, cwd: Path, *flags: str) -> Proc:
    port = free_port()
    argv = [sys.executable, "-m", "servo.cli.serve", "--lerobot", str(checkpoint), "--listen", f"tcp/127.0.0.1:{port}"]
    server = Proc([*argv, "--device", "cpu", "--health-port", "0", *flags], cwd=cwd)
    try:
        server.wait_line("servo-serve: ready", 300)
    except BaseException:
        server.stop()
        raise
    return server


def printed(server: Proc, label: str) -> list[str] | None:
    prefix = f"servo-serve: {label}: "
    lines = [line for line in server.lines if line.startswith(prefix)]
    return shlex.split(lines[0][len(prefix) :]) if lines else None


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("joints", [7, 14])
def test_an_arm_servo_does_not_know_gets_a_sim_of_its_joints(tmp_path: Path, joints: int) -> None:
    names = [f"joint_{i}.pos" for i in range(joints)]
    gpu_box = tmp_path / "gpu-box"
    checkpoint = build_trained_act(
        gpu_box / "ckpt",
        gpu_box / "data",
        repo_id="local/arm",
        cameras=tuple(SIZES),
        fps=15,
        joint_names=names,
        robot_type="my_arm" if joints == 7 else "aloha",
        chunk=37,
        sizes=SIZES,
    )
    server = serve(checkpoint, gpu_box)
    try:
        assert printed(server, "on the robot") is None  # servo has no such arm: no command that cannot work
        sim = printed(server, "without hardware")
        assert sim is not None
        assert sim[:3] == ["servo-edge", "--robot", "sim"]
        assert "fps=15" in sim
        summary, episode = tmp_path / "run.json", tmp_path / "ep.servo"
        run = ["--duration", "6", "--summary", str(summary), "--record", str(episode), "--no-status"]
        done = subprocess.run(
            [sys.executable, "-m", "servo.cli.edge", *sim[1:], *run],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
    finally:
        server.stop()
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    result = json.loads(summary.read_text())
    assert result["chunks_received"] >= 1
    header = read_recording(episode).header
    assert (header.joint_names, header.fps) == (names, 15.0)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_diffusion_policy_too_slow_for_its_chunk_is_told_its_own_options(tmp_path: Path) -> None:
    checkpoint = build_diffusion(tmp_path / "diffusion", num_inference_steps=100)
    # 8 steps at 500 fps last 16 ms: a hundred denoising steps on a CPU take longer, and the chunk
    # that would outlast them is longer than its horizon allows (at most 15 steps).
    server = serve(checkpoint, tmp_path, "--fps", "500")
    server.stop()
    (warning,) = [line for line in server.lines if "warning: a forward" in line]
    assert "n_action_steps >= " in warning, warning
    assert "at most 15 here: horizon 16 - n_obs_steps 2 + 1" in warning
    assert "lower num_inference_steps (100 now)" in warning
    assert "chunk_size" not in warning


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_checkpoint_without_its_dataset_takes_its_action_names_on_the_command_line(tmp_path: Path) -> None:
    checkpoint = build_act(tmp_path / "act7", joints=7)
    refused = subprocess.run(
        [sys.executable, "-m", "servo.cli.serve", "--lerobot", str(checkpoint), "--health-port", "0"],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert refused.returncode == 2
    (line,) = [line for line in refused.stderr.splitlines() if line.startswith("servo-serve: error:")]
    assert "--action-names NAME,NAME,…" in line
    names = ",".join(f"j{i}" for i in range(7))
    server = serve(checkpoint, tmp_path, "--action-names", names)
    server.stop()
    assert f"servo-serve: actions: {names.replace(',', ', ')}" in server.output
