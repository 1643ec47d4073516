"""Joint limits from a URDF: ``<joint name type><limit lower upper velocity/></joint>``, in ROS units.

The URDF is the user's own file (the ``robot_description`` their driver loads), read once when
the robot is built; only what bounds the motion is taken from it.
"""

from __future__ import annotations

import math
import xml.etree.ElementTree as ET
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from servo.errors import RobotError

#: A URDF larger than this is not a robot description.
MAX_URDF_BYTES = 16 * 1024 * 1024


class UrdfError(RobotError, ValueError):
    """The URDF cannot bound the joints; the message names the file and the joint."""


@dataclass(frozen=True)
class JointLimit:
    """One joint's position range and speed limit (rad and rad/s, or m and m/s). Immutable."""

    lower: float
    upper: float
    velocity: float


def joint_limits(path: str | Path, names: Sequence[str]) -> dict[str, JointLimit]:
    """The limits of the named joints.

    Args:
        path: The URDF file.
        names: Joints to look up (the robot's names).

    Raises:
        UrdfError: unreadable or malformed file, a joint missing, a joint that does not move along
            one axis (fixed, floating, planar), or a limit missing or not a finite number (a
            continuous joint has no position range: give ``lower``/``upper`` for it).
    """
    where = str(path)
    try:
        with Path(path).open("rb") as file:
            data = file.read(MAX_URDF_BYTES + 1)
    except OSError as exc:
        raise UrdfError(f"cannot read {where!r}: {exc.strerror or exc}") from None
    if len(data) > MAX_URDF_BYTES:
        raise UrdfError(f"{where} is larger than {MAX_URDF_BYTES} bytes")
    try:
        root = ET.fromstring(data)
    except ET.ParseError as exc:
        raise UrdfError(f"{where} is not XML: {exc}") from None
    joints = {joint.get("name", ""): joint for joint in root.iter("joint")}
    limits = {}
    for name in names:
        joint = joints.get(name)
        if joint is None:
            have = ", ".join(sorted(n for n in joints if n)) or "none"
            raise UrdfError(f"{where} has no joint {name!r} (its joints: {have})")
        limits[name] = _limit(where, name, joint)
    return limits


def _limit(where: str, name: str, joint: ET.Element) -> JointLimit:
    kind = joint.get("type", "")
    if kind not in ("revolute", "prismatic", "continuous"):
        raise UrdfError(f"{where}: joint {name!r} is {kind or 'untyped'}, not a revolute or prismatic joint")
    element = joint.find("limit")
    if element is None:
        raise UrdfError(f"{where}: joint {name!r} has no <limit>")
    if kind == "continuous":
        lower, upper = -math.inf, math.inf
    else:
        lower, upper = _number(where, name, element, "lower"), _number(where, name, element, "upper")
        if not lower < upper:
            raise UrdfError(f"{where}: joint {name!r} has lower {lower} >= upper {upper}")
    velocity = _number(where, name, element, "velocity")
    if velocity <= 0:
        raise UrdfError(f"{where}: joint {name!r} has velocity limit {velocity}, not > 0")
    return JointLimit(lower, upper, velocity)


def _number(where: str, name: str, element: ET.Element, attribute: str) -> float:
    text = element.get(attribute)
    if text is None:
        raise UrdfError(f"{where}: joint {name!r} has no {attribute} in its <limit>")
    try:
        value = float(text)
    except ValueError:
        raise UrdfError(f"{where}: joint {name!r} has {attribute}={text!r}, not a number") from None
    if not math.isfinite(value):
        raise UrdfError(f"{where}: joint {name!r} has {attribute}={text!r}, not a finite number")
    return value
