"""LeRobot-compatible motor calibration files and the raw-tick <-> joint-unit conversion.

LeRobot stores one JSON file per robot instance,
``<calibration dir>/robots/<robot type>/<id>.json``, mapping each motor name to
``{"id", "drive_mode", "homing_offset", "range_min", "range_max"}``.
The conversion reproduces LeRobot's ``MotorsBus._normalize`` / ``_unnormalize`` so that states and
actions match datasets recorded with LeRobot:

* ``DEGREES``: ``(raw - mid) * 360 / (resolution - 1)`` with ``mid = (range_min + range_max) / 2``;
  the raw value is not bounded and ``drive_mode`` is ignored, as in LeRobot.
* ``RANGE_0_100``: ``(clip(raw) - range_min) / (range_max - range_min) * 100``, mirrored to
  ``100 - x`` when ``drive_mode`` is 1.
* ``RANGE_M100_100``: the same scaled to -100..100, negated when ``drive_mode`` is 1.

Going back, values are truncated towards zero with ``int()`` like LeRobot does.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from enum import Enum
from pathlib import Path

import numpy as np
import numpy.typing as npt

from servo.errors import RobotError

F64 = npt.NDArray[np.float64]
I64 = npt.NDArray[np.int64]

_FIELDS = ("id", "drive_mode", "homing_offset", "range_min", "range_max")


class CalibrationError(RobotError, ValueError):
    """A calibration file is missing, malformed or inconsistent."""


class CalibrationNotFoundError(CalibrationError, FileNotFoundError):
    """No calibration file at the expected path."""


class CalibrationMismatchError(CalibrationError):
    """The motors hold another calibration than the file (another arm's file, or never written)."""


@dataclass(frozen=True)
class MotorCalibration:
    """Calibration of one motor, field for field LeRobot's ``MotorCalibration``. Immutable."""

    id: int
    drive_mode: int
    homing_offset: int
    range_min: int
    range_max: int


class NormMode(Enum):
    """How raw ticks map to user units (LeRobot's ``MotorNormMode``)."""

    RANGE_0_100 = "range_0_100"
    RANGE_M100_100 = "range_m100_100"
    DEGREES = "degrees"


def lerobot_home() -> Path:
    """LeRobot's home (datasets, calibration), honouring the same environment variables.

    ``$HF_LEROBOT_HOME``, else ``$HF_HOME/lerobot``, else ``~/.cache/huggingface/lerobot``.
    """
    if home := os.environ.get("HF_LEROBOT_HOME"):
        return Path(home).expanduser()
    hf_home = os.environ.get("HF_HOME")
    if not hf_home:
        cache = os.environ.get("XDG_CACHE_HOME") or "~/.cache"
        hf_home = str(Path(cache) / "huggingface")
    return Path(hf_home).expanduser() / "lerobot"


def calibration_root() -> Path:
    """LeRobot's calibration directory: ``$HF_LEROBOT_CALIBRATION``, else ``calibration`` in `lerobot_home`."""
    if explicit := os.environ.get("HF_LEROBOT_CALIBRATION"):
        return Path(explicit).expanduser()
    return lerobot_home() / "calibration"


def default_calibration_path(robot_id: str, robot_types: Sequence[str]) -> Path:
    """Where LeRobot keeps the calibration of the robot called ``robot_id``.

    LeRobot writes ``robots/<robot type>/<id>.json``, and the type's name changed across releases
    (the SO-100 follower was ``so100_follower`` until LeRobot 0.4 merged the SO arms into
    ``so_follower``). ``robot_types`` lists the names to try, oldest first; the first file that
    exists wins, and if none does, the first type's path is returned (loading it names that path).
    """
    robots = calibration_root() / "robots"
    candidates = [robots / kind / f"{robot_id}.json" for kind in robot_types]
    for path in candidates:
        if path.is_file():
            return path
    return candidates[0]


def load_calibration(path: str | os.PathLike[str], motors: Sequence[str] | None = None) -> dict[str, MotorCalibration]:
    """Load a LeRobot calibration file.

    Args:
        path: The JSON file.
        motors: Motor names that must be present; other entries are kept as they are.

    Returns:
        Motor name -> calibration, in file order.

    Raises:
        CalibrationNotFoundError: The file does not exist.
        CalibrationError: The file is not valid JSON, lacks a motor or a field, or holds an
            impossible value; the message names the file and the offending key.
    """
    file = Path(path)
    try:
        text = file.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise CalibrationNotFoundError(
            f"calibration file {file} does not exist; calibrate the arm with LeRobot "
            "(lerobot-calibrate) or pass the path of an existing file"
        ) from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise CalibrationError(
            f"calibration file {file} is not valid JSON (line {exc.lineno}, column {exc.colno}): {exc.msg}"
        ) from exc
    if not isinstance(data, dict):
        raise CalibrationError(f"calibration file {file}: expected a JSON object of motors")
    missing = [name for name in motors or () if name not in data]
    if missing:
        raise CalibrationError(f"calibration file {file} has no entry for motor(s) {missing}; it has {list(data)}")
    return {name: _parse_motor(file, name, entry) for name, entry in data.items()}


def _parse_motor(file: Path, name: str, entry: object) -> MotorCalibration:
    if not isinstance(entry, dict):
        raise CalibrationError(f"calibration file {file}: {name!r} must be an object")
    values: dict[str, int] = {}
    for key in _FIELDS:
        if key not in entry:
            raise CalibrationError(f"calibration file {file}: {name!r} lacks the key {key!r}")
        value = entry[key]
        if isinstance(value, bool) or not isinstance(value, int):
            raise CalibrationError(f"calibration file {file}: {name}.{key} must be an integer, got {value!r}")
        values[key] = value
    cal = MotorCalibration(**values)
    if not 0 <= cal.range_min < cal.range_max:
        raise CalibrationError(
            f"calibration file {file}: {name} needs 0 <= range_min < range_max, got "
            f"range_min={cal.range_min}, range_max={cal.range_max}"
        )
    if cal.drive_mode not in (0, 1):
        raise CalibrationError(f"calibration file {file}: {name}.drive_mode must be 0 or 1, got {cal.drive_mode}")
    return cal


def save_calibration(path: str | os.PathLike[str], calibration: Mapping[str, MotorCalibration]) -> None:
    """Write a calibration file in LeRobot's layout (4-space indented JSON), atomically."""
    file = Path(path)
    file.parent.mkdir(parents=True, exist_ok=True)
    payload = {name: asdict(cal) for name, cal in calibration.items()}
    tmp = file.with_name(f".{file.name}.tmp")
    tmp.write_text(json.dumps(payload, indent=4) + "\n", encoding="utf-8")
    tmp.replace(file)


class JointNormalizer:
    """Vectorised raw-tick <-> joint-unit conversion for a fixed set of motors.

    Immutable after construction, so it may be shared between threads.
    """

    def __init__(
        self,
        calibrations: Sequence[MotorCalibration],
        modes: Sequence[NormMode],
        resolution: int = 4096,
    ) -> None:
        """Precompute per-motor constants.

        Args:
            calibrations: One calibration per motor, in vector order.
            modes: One normalisation mode per motor.
            resolution: Encoder ticks per turn (4096 for the STS3215).
        """
        if len(calibrations) != len(modes):
            raise ValueError("need one NormMode per calibration")
        self.modes = tuple(modes)
        self.range_min = np.array([c.range_min for c in calibrations], dtype=np.int64)
        self.range_max = np.array([c.range_max for c in calibrations], dtype=np.int64)
        equal = [c.id for c in calibrations if c.range_min == c.range_max]
        if equal:
            raise CalibrationError(f"motors {equal} have range_min == range_max")
        self._lo = self.range_min.astype(np.float64)
        self._span = (self.range_max - self.range_min).astype(np.float64)
        self._mid = (self._lo + self.range_max) / 2
        self._ticks = float(resolution - 1)
        self._inverted = np.array([c.drive_mode == 1 for c in calibrations])
        self._deg = np.array([m is NormMode.DEGREES for m in modes])
        self._pct = np.array([m is NormMode.RANGE_0_100 for m in modes])
        self._sym = np.array([m is NormMode.RANGE_M100_100 for m in modes])

    def to_units(self, raw: npt.ArrayLike) -> F64:
        """Raw encoder ticks -> joint units."""
        ticks = np.asarray(raw, dtype=np.float64)
        degrees = (ticks - self._mid) * 360.0 / self._ticks
        fraction = (np.clip(ticks, self._lo, self.range_max) - self._lo) / self._span
        percent = np.where(self._inverted, 100.0 - fraction * 100.0, fraction * 100.0)
        symmetric = fraction * 200.0 - 100.0
        symmetric = np.where(self._inverted, -symmetric, symmetric)
        units: F64 = np.select([self._deg, self._pct], [degrees, percent], symmetric)
        return units

    def to_raw(self, units: npt.ArrayLike) -> I64:
        """Joint units -> raw encoder ticks (not clamped to the calibrated range)."""
        value = np.asarray(units, dtype=np.float64)
        degrees = value * self._ticks / 360.0 + self._mid
        pct = np.clip(np.where(self._inverted, 100.0 - value, value), 0.0, 100.0)
        percent = pct / 100.0 * self._span + self._lo
        sym = np.clip(np.where(self._inverted, -value, value), -100.0, 100.0)
        symmetric = (sym + 100.0) / 200.0 * self._span + self._lo
        raw = np.select([self._deg, self._pct], [degrees, percent], symmetric)
        ticks: I64 = np.trunc(raw).astype(np.int64)
        return ticks

    def clamp_raw(self, raw: npt.ArrayLike) -> I64:
        """Clip raw ticks into each motor's calibrated ``[range_min, range_max]``."""
        clamped: I64 = np.clip(np.asarray(raw, dtype=np.int64), self.range_min, self.range_max)
        return clamped
