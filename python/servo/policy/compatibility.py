"""Robot/policy compatibility: the sync-safety contract checked before any chunk is executed.

Every rule of docs/design/serving.md §3. Used by the server at session open and by the edge's local engines
at start, so a policy is accepted or refused for the same reasons wherever it runs. A rejection
names exactly what did not match; warnings are returned to the client in the ack.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from servo.policy.protocol import PolicySpec
from servo.wire import SUPPORTED_SCHEMA_VERSIONS, PolicyInfo, Rejection, SessionOpen

#: Relative fps difference tolerated without a warning.
FPS_TOLERANCE = 0.01
#: Relative aspect-ratio difference tolerated without a warning (the server resizes anyway).
ASPECT_TOLERANCE = 0.02


@dataclass(frozen=True)
class Admission:
    """A successful validation: what the session will run with."""

    schema_version: int
    rtc: bool
    task: str
    warnings: list[str]


def describe(
    spec: PolicySpec,
    *,
    serving_mode: Literal["shared", "exclusive"],
    revision: str = "",
    default_task: str = "",
    pin_task: bool = False,
    strict_fps: bool = False,
) -> PolicyInfo:
    """The wire description of a policy (status replies, session acks, local checks)."""
    return PolicyInfo(
        model=spec.model,
        revision=revision or spec.revision,
        features=spec.features,
        chunk_size=spec.chunk_size,
        fps=spec.fps,
        supports_rtc=spec.supports_rtc,
        chunk_stateless=spec.chunk_stateless,
        serving_mode=serving_mode,
        default_task=default_task,
        pin_task=pin_task,
        strict_fps=strict_fps,
        tuning=spec.tuning,
    )


def validate_open(request: SessionOpen, policy: PolicyInfo) -> Admission | Rejection:
    """Check a client's session request against the served policy (capacity is checked elsewhere)."""
    common = sorted(set(request.schema_versions) & set(SUPPORTED_SCHEMA_VERSIONS))
    if not common:
        return Rejection(
            "schema_version",
            f"client speaks schema versions {sorted(request.schema_versions)}, server speaks "
            f"{list(SUPPORTED_SCHEMA_VERSIONS)}",
        )
    want, have = policy.features, request.features
    if have.action_names != want.action_names:
        return Rejection("action_names", _order_mismatch("action", have.action_names, want.action_names))
    if len(have.state_names) != len(want.state_names):
        return Rejection(
            "state_names",
            f"client state has {len(have.state_names)} values, policy expects {len(want.state_names)} "
            f"({', '.join(want.state_names)})",
        )
    missing = sorted(set(want.cameras) - set(have.cameras))
    if missing:
        return Rejection(
            "cameras",
            f"policy needs camera(s) {', '.join(missing)}; client offers {', '.join(sorted(have.cameras)) or 'none'}",
        )
    warnings: list[str] = []
    for unit_check in (
        _units("action", want.action_names, have.action_units, want.action_units),
        _units("state", want.state_names, have.state_units, want.state_units),
    ):
        if isinstance(unit_check, Rejection):
            return unit_check
        warnings += unit_check
    if have.state_names != want.state_names:
        warnings.append(f"state names differ: client {have.state_names}, policy {want.state_names}")
    for name in sorted(want.cameras):
        theirs, ours = have.cameras[name], want.cameras[name]
        if theirs.height <= 0 or theirs.width <= 0:
            return Rejection("cameras", f"camera {name!r} declares size {theirs.height}x{theirs.width}")
        if abs(theirs.width / theirs.height - ours.width / ours.height) > ASPECT_TOLERANCE * ours.width / ours.height:
            warnings.append(
                f"camera {name!r} is {theirs.height}x{theirs.width}, the policy was trained on "
                f"{ours.height}x{ours.width} (different aspect ratio)"
            )
    if abs(request.fps - policy.fps) > FPS_TOLERANCE * policy.fps:
        message = f"client runs at {request.fps:g} fps, policy was trained at {policy.fps:g} fps"
        if policy.strict_fps:
            return Rejection("fps", message)
        warnings.append(message)
    task = request.task or policy.default_task
    if policy.pin_task and task != policy.default_task:
        return Rejection(
            "task",
            f"this server is pinned to task {policy.default_task!r}, client asked for {task!r}",
        )
    rtc = request.rtc and policy.supports_rtc
    if request.rtc and not policy.supports_rtc:
        warnings.append("policy does not support RTC; chunks will be appended instead")
    return Admission(schema_version=common[-1], rtc=rtc, task=task, warnings=warnings)


#: How each known unit reads in a message.
_UNIT_TEXT = {
    "degrees": "degrees",
    "range_m100_100": "range -100..100 (LeRobot use_degrees=False)",
    "range_0_100": "range 0..100",
    "radians": "radians",
    "meters": "meters",
}
#: (policy unit, robot unit) -> how to fix the mismatch.
_UNIT_FIX = {
    ("range_m100_100", "degrees"): "run the robot with --robot-opt use_degrees=false or serve a degrees checkpoint",
    ("degrees", "range_m100_100"): "run the robot with --robot-opt use_degrees=true or serve a -100..100 checkpoint",
    ("degrees", "radians"): "run the ROS 2 robot with --robot-opt units=degrees",
    ("radians", "degrees"): "run the ROS 2 robot with --robot-opt units=radians",
}
#: A policy unit a ROS 2 robot cannot convert to: the joint's value is passed through as ``raw``.
_NOT_SI = ("range_0_100", "range_m100_100")
#: SI units only a ROS 2 robot declares (an SO arm's are degrees and percent).
_ROS_UNITS = ("radians", "meters")


def _units(what: str, names: list[str], robot: list[str], policy: list[str]) -> Rejection | list[str]:
    """Compare declared units joint by joint; undeclared on one side is a warning, never a refusal."""
    for side, units in (("robot", robot), ("policy", policy)):
        if units and len(units) != len(names):
            return Rejection("units", f"{side} declares {len(units)} {what} units for {len(names)} {what} values")
    if not robot and not policy:
        return []  # neither side speaks of units: nothing to compare, nothing learned
    if not robot or not policy:
        silent = "robot" if not robot else "policy"
        return [f"{what} units are not declared by the {silent}; they are not checked"]
    clashes = [(name, r, p) for name, r, p in zip(names, robot, policy, strict=True) if r and p and r != p]
    if clashes:
        _, r, p = clashes[0]
        joints = ", ".join(name for name, rr, pp in clashes if (rr, pp) == (r, p))
        verb = "acts" if what == "action" else "expects its state"
        fix = _UNIT_FIX.get(
            (p, r), "run the robot in the policy's units or correct the declared units (model.options.units)"
        )
        if p in _NOT_SI and r in _ROS_UNITS:
            fix = (
                f"on a ROS 2 robot give {'that joint' if joints.count(',') == 0 else 'those joints'} raw in "
                "--robot-opt units (one unit per joint: raw passes the driver's value through undeclared), or serve "
                "a policy in SI units"
            )
        return Rejection(
            "units",
            f"policy {verb} in {_UNIT_TEXT.get(p, p)} but the robot uses {_UNIT_TEXT.get(r, r)} ({joints}); {fix}",
        )
    undeclared = [name for name, r, p in zip(names, robot, policy, strict=True) if not (r and p)]
    return [f"{what} units are not declared for {', '.join(undeclared)}; they are not checked"] if undeclared else []


def _order_mismatch(what: str, have: list[str], want: list[str]) -> str:
    if sorted(have) == sorted(want):
        first = next(i for i, (a, b) in enumerate(zip(have, want, strict=True)) if a != b)
        return (
            f"{what} names are in a different order: position {first} is {have[first]!r} on the "
            f"client, {want[first]!r} on the policy (expected order: {', '.join(want)})"
        )
    extra = [n for n in have if n not in want]
    missing = [n for n in want if n not in have]
    parts = []
    if missing:
        parts.append(f"missing {', '.join(missing)}")
    if extra:
        parts.append(f"unexpected {', '.join(extra)}")
    return f"{what} names do not match the policy ({'; '.join(parts)}); expected {', '.join(want)}"
