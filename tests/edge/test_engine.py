"""The engine loop written once: the engine table, the failure classification, and what every
engine inherits from it (a failing local policy goes DEAD the same way on a worker thread and on
the sequential engine's control thread)."""

from __future__ import annotations

from typing import Any, get_args

import anyio
import pytest

from servo.client import RequestTimeout, SendFailed, ServerError, SessionLost
from servo.edge.config import EdgeConfig, InferenceMode, ReplayConfig
from servo.edge.engine import EngineBase
from servo.edge.engines import ENGINES, make_engine
from servo.edge.failsafe import EngineState, FailSafe, FailSafeConfig
from servo.edge.failures import MAX_FAILURES_IN_ROW, Failures, PolicyFailed, SessionEnded
from servo.edge.local import RtcEngine, SyncEngine
from servo.edge.remote import RemoteEngine
from servo.edge.replay import ReplayEngine
from servo.edge.runtime import EdgeRuntime, RunOptions
from servo.logs import get_logger
from servo.policy.reference import SO100_JOINTS
from servo.robots import RobotDescription
from tests.server.policies import FixedComputePolicy

pytestmark = pytest.mark.anyio

CAM = (48, 64)


def sim() -> RobotDescription:
    return RobotDescription("sim", {"cameras": f"front:{CAM[1]}x{CAM[0]}"})


@pytest.mark.parametrize(
    ("mode", "kind"),
    [("remote", RemoteEngine), ("sync", SyncEngine), ("rtc", RtcEngine), ("replay", ReplayEngine)],
)
def test_the_engine_table_builds_the_engine_each_inference_mode_names(mode: str, kind: type[EngineBase]) -> None:
    assert set(ENGINES) == set(get_args(InferenceMode))
    config = EdgeConfig(inference=mode, replay=ReplayConfig(trajectory="ep.servo"))  # type: ignore[arg-type]
    engine = make_engine(config, sim().spec())
    assert type(engine) is kind
    assert engine.config is config


def failures(streak: int = 2) -> tuple[Failures, FailSafe]:
    failsafe = FailSafe(FailSafeConfig(timeout_streak=streak))
    return Failures(failsafe, get_logger(__name__)), failsafe


@pytest.mark.parametrize("exc", [RequestTimeout("no answer"), SendFailed("put failed")])
def test_timeouts_end_the_session_only_as_a_streak(exc: Exception) -> None:
    classify, failsafe = failures(streak=3)
    classify.failed(exc)
    classify.failed(exc)
    with pytest.raises(SessionEnded, match=r"3 .* in a row"):
        classify.failed(exc)
    assert failsafe.timeouts == 3
    assert classify.errors == 0


def test_a_server_error_is_counted_and_a_forgotten_session_ends_it() -> None:
    classify, _ = failures()
    classify.failed(ServerError("rate_limited", "slow down"))
    assert classify.errors == 1
    with pytest.raises(SessionEnded, match="no longer knows"):
        classify.failed(ServerError("unknown_session", "who are you"))
    assert classify.errors == 2


def test_a_lost_session_ends_it_at_once() -> None:
    classify, _ = failures()
    with pytest.raises(SessionEnded, match="liveliness lost"):
        classify.failed(SessionLost("server liveliness lost"))


def test_policy_failures_in_a_row_are_dead_and_a_success_restarts_the_count() -> None:
    classify, failsafe = failures()
    for _ in range(MAX_FAILURES_IN_ROW - 1):
        classify.failed(PolicyFailed("RuntimeError: bug"))
    classify.succeeded()
    for _ in range(MAX_FAILURES_IN_ROW - 1):
        classify.failed(PolicyFailed("RuntimeError: bug"))
    assert not failsafe.dead.is_set()
    classify.failed(PolicyFailed("RuntimeError: bug"))
    assert failsafe.state is EngineState.DEAD
    assert failsafe.reason == f"policy failed {MAX_FAILURES_IN_ROW} times in a row: RuntimeError: bug"


def test_anything_else_is_an_engine_bug_and_raised() -> None:
    classify, failsafe = failures()
    with pytest.raises(KeyError):
        classify.failed(KeyError("a bug"))
    assert failsafe.state is EngineState.CONNECTING


class BreaksAfterWarmup(FixedComputePolicy):
    """Warms up, then raises on every forward (a bug that shows only on real observations)."""

    def __init__(self) -> None:
        super().__init__(joints=SO100_JOINTS, cameras={"front": CAM})
        self.forwards = 0

    def predict_chunk(self, batch: Any, inference_delay: int, prefix: Any) -> Any:
        self.forwards += 1
        if self.forwards > 1:
            raise RuntimeError("policy bug")
        return super().predict_chunk(batch, inference_delay, prefix)


@pytest.mark.parametrize("kind", [RtcEngine, SyncEngine])
async def test_a_failing_local_policy_goes_dead_and_the_arm_is_parked(kind: type[RtcEngine]) -> None:
    robot = sim()
    engine = kind(EdgeConfig(), robot.spec(), policy=BreaksAfterWarmup())
    with anyio.fail_after(60):
        summary = await EdgeRuntime(robot, engine, EdgeConfig(), RunOptions(duration_s=30)).run()
    assert summary.final_state == "dead"
    assert summary.stop_reason == (
        f"engine dead: policy failed {MAX_FAILURES_IN_ROW} times in a row: RuntimeError: policy bug"
    )
    assert summary.errors == MAX_FAILURES_IN_ROW
    assert summary.chunks_received == 0
    assert summary.parked
