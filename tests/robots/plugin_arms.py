"""Robot plugins for the registry tests, written as an out-of-tree driver would be (and some broken ones)."""

from __future__ import annotations

from typing import Annotated

import msgspec

from servo.robots import Cameras, PoseSource, RobotParts, SimCameraConfig, SimCameras, SimConfig, SimSO100


class TwinOptions(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """Options of the twin arm."""

    fps: Annotated[float, msgspec.Meta(gt=0, description="Control rate (Hz).")] = 30.0
    camera: Annotated[bool, msgspec.Meta(description="Give it a 64x48 camera named 'eye'.")] = False


def twin(options: TwinOptions) -> RobotParts:
    """A simulated arm under another name (a plugin with options and cameras)."""
    config = SimConfig(fps=options.fps, cameras=(SimCameraConfig("eye", 48, 64),) if options.camera else ())

    def cameras(poses: PoseSource) -> Cameras:
        return SimCameras(config, poses)

    return RobotParts(SimSO100(config), cameras)


def bare() -> SimSO100:
    """An arm that takes no options and has no cameras."""
    return SimSO100(SimConfig(cameras=()))


def two_parameters(options: TwinOptions, extra: int) -> SimSO100:
    return bare()


def unannotated(options):  # type: ignore[no-untyped-def]
    return bare()


def not_a_struct(options: dict[str, int]) -> SimSO100:
    return bare()


def returns_a_number(options: TwinOptions) -> int:
    return 3


def fails(options: TwinOptions) -> SimSO100:
    raise RuntimeError("the arm's driver library is missing")


NOT_CALLABLE = 3
