"""servo-trace over a real run: a forward that hangs until the robot stalls makes it stutter, and
the trace of that minute joins the recording and the audit log into one story (and a PNG)."""

from __future__ import annotations

import re
import time
from datetime import datetime
from pathlib import Path

import pytest

from servo.cli.trace import main
from servo.edge.remote import RemoteEngine
from servo.edge.runtime import RunOptions
from tests.edge.harness import GatedPolicy, edge_config, running_edge, small_sim
from tests.support import eventually, make_manifest, running_server

pytestmark = pytest.mark.anyio


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, int]:
    """One recorded run with a stall in the middle: (recording, audit log, wall ns before the stall)."""
    import anyio

    from tests.support import free_port

    workdir = tmp_path_factory.mktemp("trace")
    recording, audit = workdir / "robot-217.servo", workdir / "r0.audit.jsonl"
    policy = GatedPolicy(cameras={"front": (48, 64)}, chunk_size=20)
    port = free_port()
    # make_manifest's extra lines continue its [ops] table.
    manifest = make_manifest(port, extra=f'audit_log = "{audit}"\n[serving]\nreplica = "r0"')

    async def go() -> int:
        async with running_server(manifest, policy):
            sim = small_sim()
            engine = RemoteEngine(edge_config(port, client_id="robot-217"), sim.spec())
            async with running_edge(sim, engine, RunOptions(record_path=str(recording))) as edge:
                await eventually(lambda: engine.chunks_received >= 5, 15, "streaming")
                before = time.time_ns()
                policy.budget = 0  # the next forward hangs until released: the robot runs dry
                await eventually(lambda: engine.state.value == "stalled", 15, "the robot stalled")
                held = engine.statistics().fallback_ticks
                await eventually(lambda: engine.statistics().fallback_ticks >= held + 15, 15, "half a second held")
                policy.release.set()
                await eventually(lambda: engine.state.value == "streaming", 15, "streaming again")
                streamed = engine.chunks_received
                await eventually(lambda: engine.chunks_received >= streamed + 3, 15, "three more chunks")
                await edge.stop()
        return before

    return recording, audit, anyio.run(go, backend="asyncio")


def test_the_minute_of_the_stutter_joins_recording_and_audit(
    run: tuple[Path, Path, int], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    recording, audit, before = run
    at = datetime.fromtimestamp((before - 2_000_000_000) / 1e9).astimezone().isoformat()
    png = tmp_path / "trace.png"
    window = ["--robot", "robot-217", "--at", at, "--window", "30"]
    code = main([*window, "--recording", str(recording.parent), "--audit", str(audit), "--plot", str(png)])
    out = capsys.readouterr().out
    assert code == 0, out
    lines = out.splitlines()
    assert lines[0].startswith("robot robot-217: ")
    assert "joined with the audit" in lines[0]
    # The stall: the state machine left streaming, the arm ran without fresh actions, and the
    # requests it waited on spent their time at the replica.
    assert any("transition" in line and ("degraded" in line or "stalled" in line) for line in lines)
    assert any(" fallback " in line and "without a fresh action" in line for line in lines)
    inference = [float(m) for m in re.findall(r"r0: ok, queue [0-9.]+ ms, inference ([0-9.]+) ms", out)]
    assert inference, out
    assert max(inference) > 500  # the forward that hung until the robot stalled, and half a second more
    assert "look at the replica" in out, out
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert png.stat().st_size > 20_000


def test_a_whole_episode(run: tuple[Path, Path, int], capsys: pytest.CaptureFixture[str]) -> None:
    recording, audit, _ = run
    assert main(["--robot", "robot-217", "--episode", "0", "--recording", str(recording), "--audit", str(audit)]) == 0
    out = capsys.readouterr().out
    assert "transition  connecting: start" in out
    assert "seq 1 " in out


def test_inputs_that_cannot_answer_are_one_line_and_exit_2(
    run: tuple[Path, Path, int], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    recording, _, before = run
    assert main(["--robot", "robot-217", "--at", "nope", "--recording", str(recording)]) == 2
    assert "--at 'nope'" in capsys.readouterr().err
    late = datetime.fromtimestamp(before / 1e9 + 3600).astimezone().isoformat()
    assert main(["--robot", "robot-217", "--at", late, "--recording", str(recording)]) == 2
    miss = capsys.readouterr().err
    assert "no recording of 'robot-217' covers" in miss
    # ... and which times they do cover, so the next --at can hit them.
    assert f"its recordings cover {datetime.fromtimestamp(before / 1e9).strftime('%Y-%m-%d')} " in miss
    assert f"({recording.name})" in miss
    assert main(["--robot", "robot-9", "--episode", "0", "--recording", str(recording)]) == 2
    bad = tmp_path / "bad.jsonl"
    bad.write_text("not json\n")
    assert main(["--robot", "robot-217", "--episode", "0", "--recording", str(recording), "--audit", str(bad)]) == 2
    assert f"--audit {bad} line 1" in capsys.readouterr().err
