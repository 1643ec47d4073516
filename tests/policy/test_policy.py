"""The policy adapter layer: loader, runner checks, reference policy."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from servo.policy import BatchingPolicy, DecodedObservation, PolicyLoadError, Prepared, load_policy
from servo.policy.compatibility import Admission, describe, validate_open
from servo.policy.protocol import PolicySpec
from servo.policy.reference import ReferencePolicy
from servo.policy.runner import InferenceRunner, PolicyOutputError, synthetic_observation
from servo.wire import SUPPORTED_SCHEMA_VERSIONS, Features, Rejection, SessionOpen

SMALL = {"front": (48, 64)}


class _Passthrough:
    def preprocess(self, obs: DecodedObservation) -> Prepared:
        return Prepared(obs.state, obs.prefix_model)

    def postprocess(self, chunk: np.ndarray) -> np.ndarray:
        return chunk

    def reset(self) -> None:
        pass


class ScriptedPolicy:
    """Returns whatever the test puts in ``output``; records the delay it was given."""

    def __init__(self, output: np.ndarray) -> None:
        self.output = output
        self.delays: list[int] = []
        self._spec = PolicySpec(
            "t", "1", Features(["a"], ["a"], {}), chunk_size=4, fps=10, supports_rtc=True, chunk_stateless=True
        )

    @property
    def spec(self) -> PolicySpec:
        return self._spec

    def make_processor(self) -> _Passthrough:
        return _Passthrough()

    def predict_chunk(self, batch: Any, inference_delay: int, prefix: Any) -> np.ndarray:
        self.delays.append(inference_delay)
        return self.output

    def reset(self) -> None:
        pass


def make_scripted(**_: Any) -> ScriptedPolicy:
    return ScriptedPolicy(np.zeros((4, 1), np.float32))


def make_not_a_policy(**_: Any) -> object:
    return object()


def test_runner_clamps_the_delay_to_the_chunk() -> None:
    policy = ScriptedPolicy(np.zeros((4, 1), np.float32))
    runner = InferenceRunner(policy)
    obs = DecodedObservation(np.zeros(1, np.float32), {})
    for delay in (-3, 2, 99):
        runner.infer(policy.make_processor(), obs, delay)
    assert policy.delays == [0, 2, 4]


@pytest.mark.parametrize(
    ("output", "message"),
    [
        (np.zeros((3, 1), np.float32), r"shape \(3, 1\), expected \(4, 1\)"),
        (np.array([[0.0], [np.nan], [0.0], [0.0]], np.float32), "NaN or inf"),
        (np.array([[0.0], [np.inf], [0.0], [0.0]], np.float32), "NaN or inf"),
    ],
)
def test_runner_refuses_outputs_that_must_not_reach_a_robot(output: np.ndarray, message: str) -> None:
    policy = ScriptedPolicy(output)
    with pytest.raises(PolicyOutputError, match=message):
        InferenceRunner(policy).infer(policy.make_processor(), DecodedObservation(np.zeros(1, np.float32), {}), 0)


class ScriptedBatchPolicy(ScriptedPolicy):
    """A batching `ScriptedPolicy`: sample ``i``'s chunk is ``state[0]`` everywhere (NaN stays NaN).

    Raises for the whole batch when a state is negative; records every call.
    """

    def __init__(self) -> None:
        super().__init__(np.zeros((4, 1), np.float32))
        self.calls: list[tuple[list[float], list[int], list[int | None]]] = []

    def predict_chunk(self, batch: Any, inference_delay: int, prefix: Any) -> np.ndarray:
        if batch[0] < 0:
            raise RuntimeError("negative state")
        return np.full((4, 1), batch[0], np.float32)

    def predict_chunk_batch(self, batches: Any, inference_delays: Any, prefixes: Any) -> np.ndarray:
        self.calls.append(
            ([float(b[0]) for b in batches], list(inference_delays), [p if p is None else len(p) for p in prefixes])
        )
        if any(b[0] < 0 for b in batches):
            raise RuntimeError("negative state in the batch")
        return np.stack([np.full((4, 1), b[0], np.float32) for b in batches])


def _obs(value: float, prefix: int | None = None) -> DecodedObservation:
    return DecodedObservation(
        np.full(1, value, np.float32), {}, prefix_model=None if prefix is None else np.zeros((prefix, 1), np.float32)
    )


def test_runner_batches_with_per_sample_delays_and_prefixes() -> None:
    policy = ScriptedBatchPolicy()
    assert isinstance(policy, BatchingPolicy)
    runner = InferenceRunner(policy)
    requests = [(policy.make_processor(), _obs(1, 2), 1), (policy.make_processor(), _obs(2), 99)]
    outcomes = runner.infer_batch(requests)
    assert policy.calls == [([1.0, 2.0], [1, 4], [2, None])]  # delays clamped to the chunk, like infer
    assert [o[0][0, 0] for o in outcomes] == [1.0, 2.0]  # type: ignore[index]


def test_runner_batch_members_fail_alone() -> None:
    policy = ScriptedBatchPolicy()
    runner = InferenceRunner(policy)
    values = [1.0, -1.0, float("nan"), 4.0]  # -1: the batched forward raises, then that sample alone
    outcomes = runner.infer_batch([(policy.make_processor(), _obs(v), 0) for v in values])
    assert len(policy.calls) == 1  # tried together once, then each alone
    assert outcomes[0][0][0, 0] == 1.0  # type: ignore[index]
    assert isinstance(outcomes[1], RuntimeError)
    assert isinstance(outcomes[2], PolicyOutputError)  # its chunk is not finite: refused, only it
    assert outcomes[3][0][0, 0] == 4.0  # type: ignore[index]


def test_runner_serves_a_batch_one_by_one_for_a_policy_without_the_batch_api() -> None:
    policy = ScriptedPolicy(np.zeros((4, 1), np.float32))
    assert not isinstance(policy, BatchingPolicy)
    outcomes = InferenceRunner(policy).infer_batch([(policy.make_processor(), _obs(1), d) for d in (1, 2)])
    assert policy.delays == [1, 2]
    assert all(isinstance(o, tuple) for o in outcomes)


def test_loader_builtin_and_module_factory() -> None:
    assert isinstance(load_policy("reference", {"cameras": SMALL}), ReferencePolicy)
    assert isinstance(load_policy("tests.policy.test_policy:make_scripted"), ScriptedPolicy)


@pytest.mark.parametrize(
    ("source", "options", "message"),
    [
        ("nonsense", {}, "neither a built-in"),
        ("no_such_module_xyz:factory", {}, "cannot import"),
        ("tests.policy.test_policy:missing", {}, "has no callable 'missing'"),
        ("reference", {"bogus_option": 1}, "model.options do not fit"),
        ("tests.policy.test_policy:make_not_a_policy", {}, "no chunk API"),
    ],
)
def test_loader_errors_are_specific(source: str, options: dict[str, Any], message: str) -> None:
    with pytest.raises(PolicyLoadError, match=message):
        load_policy(source, options)


def test_compile_needs_a_compile_method() -> None:
    with pytest.raises(PolicyLoadError, match="no compile"):
        InferenceRunner(ScriptedPolicy(np.zeros((4, 1), np.float32)), compile=True)


@pytest.mark.slow
def test_reference_policy_compiles_and_matches_eager() -> None:
    eager, compiled = ReferencePolicy(cameras=SMALL), ReferencePolicy(cameras=SMALL)
    obs = synthetic_observation(eager)
    a = InferenceRunner(eager).infer(eager.make_processor(), obs, 0)[0]
    b = InferenceRunner(compiled, compile=True).infer(compiled.make_processor(), obs, 0)[0]
    np.testing.assert_allclose(a, b, atol=1e-4)


def test_reference_policy_is_deterministic_and_anchored_on_the_state() -> None:
    p1, p2 = ReferencePolicy(cameras=SMALL, seed=3), ReferencePolicy(cameras=SMALL, seed=3)
    obs = synthetic_observation(p1)
    obs.state = np.full(6, 12.0, np.float32)
    r1 = InferenceRunner(p1).infer(p1.make_processor(), obs, 0)
    r2 = InferenceRunner(p2).infer(p2.make_processor(), obs, 0)
    np.testing.assert_array_equal(r1[0], r2[0])
    # Robot-space = model-space deltas + the state cached at preprocess.
    np.testing.assert_allclose(r1[1], r1[0] + 12.0, atol=1e-5)


def test_reference_policy_continues_the_rtc_prefix() -> None:
    policy = ReferencePolicy(cameras=SMALL)
    obs = synthetic_observation(policy)
    prefix = np.full((8, 6), 3.0, np.float32)
    obs.prefix_robot = prefix
    _, robot = InferenceRunner(policy).infer(policy.make_processor(), obs, 4)
    # The steps that execute during inference equal the prefix exactly.
    np.testing.assert_allclose(robot[:4], prefix[:4], atol=1e-5)
    assert not np.allclose(robot[10:], 3.0)


@pytest.mark.skipif(importlib.util.find_spec("lerobot") is not None, reason="LeRobot is installed here")
def test_lerobot_source_without_lerobot_says_how_to_get_it(tmp_path: Path) -> None:
    hint = r"needs LeRobot >= 0\.5 on Python >= 3\.12: pip install 'servo-robotics\[lerobot\]'"
    with pytest.raises(PolicyLoadError, match=hint):
        load_policy("lerobot", {"path": str(tmp_path)})
    with pytest.raises(PolicyLoadError, match=r"model\.options\.pathh: unknown key"):
        load_policy("lerobot", {"pathh": str(tmp_path)})


def _open_units(robot: list[str], policy: list[str]) -> Admission | Rejection:
    names = ["a.pos", "gripper.pos"]
    info = describe(
        PolicySpec("t", "1", Features(names, names, {}, policy, policy), 4, 30.0, False, True),
        serving_mode="shared",
    )
    request = SessionOpen(
        "c", list(SUPPORTED_SCHEMA_VERSIONS), Features(names, names, {}, robot, robot), 30.0, bytes(32)
    )
    return validate_open(request, info)


def test_units_are_compared_joint_by_joint() -> None:
    same = _open_units(["degrees", "range_0_100"], ["degrees", "range_0_100"])
    assert isinstance(same, Admission)
    assert same.warnings == []
    neither = _open_units([], [])
    assert isinstance(neither, Admission)
    assert neither.warnings == []
    partly = _open_units(["degrees", ""], ["degrees", "range_0_100"])
    assert isinstance(partly, Admission)
    assert partly.warnings == [
        "action units are not declared for gripper.pos; they are not checked",
        "state units are not declared for gripper.pos; they are not checked",
    ]
    clash = _open_units(["degrees", "range_0_100"], ["radians", "range_0_100"])
    assert isinstance(clash, Rejection)
    assert clash.code == "units"
    assert clash.reason.startswith("policy acts in radians but the robot uses degrees (a.pos); ")


def test_a_percent_gripper_on_a_ros_robot_is_told_about_raw() -> None:
    clash = _open_units(["degrees", "meters"], ["degrees", "range_0_100"])
    assert isinstance(clash, Rejection)
    assert clash.reason == (
        "policy acts in range 0..100 but the robot uses meters (gripper.pos); on a ROS 2 robot give that joint raw "
        "in --robot-opt units (one unit per joint: raw passes the driver's value through undeclared), or serve a "
        "policy in SI units"
    )
    # ... which the robot then declares as no unit: nothing left to refuse.
    assert isinstance(_open_units(["degrees", ""], ["degrees", "range_0_100"]), Admission)
