"""The built-in robots as factories, with their options: the simulated arm, the SO-100 / SO-101, ROS 2.

Each is written exactly as a plugin would be (`servo.robots.registry` has the contract): a
function taking one frozen msgspec Struct of options and returning the joints and a maker of the
cameras. Building opens nothing: ports and cameras open on ``connect``.
"""

from __future__ import annotations

from typing import Annotated, Any

import msgspec

from servo.config import (
    ConfigError,
    FieldError,
    Hertz,
    NonEmptyStr,
    NonNegativeFloat,
    NonNegativeInt,
    PositiveFloat,
    PositiveInt,
    Seconds,
    doc,
)

from .camera_list import CameraEntry, parse_cameras
from .cameras import CameraGroup, OpenCVCamera, OpenCVCameraConfig
from .protocol import Cameras, PoseSource, RobotParts
from .ros2.options import Ros2Options, resolve
from .sim import SimCameraConfig, SimConfig, SimJoints, SimSO100
from .sim_cameras import SimCameras
from .so100_joints import JOINT_NAMES
from .so_follower import SO100_ARM, SO101_ARM, SOArm, SOFollower, SOFollowerConfig


def _checked_cameras(value: str) -> list[CameraEntry]:
    try:
        return parse_cameras(value)
    except ValueError as exc:
        raise FieldError("cameras", str(exc)) from None


class SimOptions(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """Options of the simulated arm (``--robot sim``).

    ``servo-edge`` fills in ``joints``, ``units``, ``fps`` and ``cameras`` from the policy it
    connects to when they are not given (`servo.edge.adapt`), so the sim fits any checkpoint.
    """

    fps: Annotated[Hertz, doc("Control rate (Hz).")] = 30.0
    cameras: Annotated[str, doc("Simulated cameras, e.g. 'front,wrist' or 'front:640x480@30'; 'none' for none.")] = (
        "front,wrist"
    )
    time_constant_s: Annotated[Seconds, doc("First-order time constant of every joint (s).")] = 0.075
    noise_std: Annotated[NonNegativeFloat, doc("Gaussian noise added to every state reading (joint units).")] = 0.0
    seed: Annotated[int, doc("Seed of the sensor noise and the rendered textures.")] = 0
    initial_pose: Annotated[
        tuple[float, ...] | None, doc("Comma-separated joint values to start from, one per joint (default: rest pose).")
    ] = None
    realtime: Annotated[bool, doc("Advance the simulation with the monotonic clock.")] = True
    joints: Annotated[
        tuple[str, ...],
        doc("Joint names in order, any number (default: the SO-100's six; servo-edge: the policy's)."),
    ] = ()
    units: Annotated[
        tuple[str, ...],
        doc("Joint units (degrees, radians, meters, range_0_100, range_m100_100; one, or one per joint): ranges."),
    ] = ()

    def check(self) -> None:
        """Camera syntax (simulated cameras take a size but no device); one initial value and unit per joint."""
        for entry in _checked_cameras(self.cameras):
            if entry.source is not None:
                raise FieldError("cameras", f"simulated camera {entry.name!r} takes no device, only a size")
        n = len(self.joints or JOINT_NAMES)
        if self.initial_pose is not None and len(self.initial_pose) != n:
            raise FieldError("initial_pose", f"needs {n} values, one per joint")
        if self.units and (not self.joints or len(self.units) not in (1, n)):
            raise FieldError("units", f"needs one, or one per joint of joints ({n})" if self.joints else "needs joints")
        if len(set(self.joints)) != len(self.joints):
            raise FieldError("joints", "names must be unique")


class SOFollowerOptions(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """Options of the real SO-100 and SO-101 follower arms (``--robot so100``, ``--robot so101``)."""

    port: Annotated[NonEmptyStr, doc("Serial port of the servo bus, e.g. /dev/ttyACM0.")]
    calibration: Annotated[str, doc("Path of a LeRobot calibration JSON (or give id).")] = ""
    id: Annotated[str, doc("LeRobot robot id: its calibration file is found where LeRobot writes it.")] = ""
    write_calibration: Annotated[
        bool, doc("Write the calibration file into motors that hold another one (else refuse to start).")
    ] = False
    cameras: Annotated[str, doc("OpenCV cameras, e.g. 'front:0:640x480@30,wrist:/dev/video2'.")] = ""
    max_relative_target: Annotated[
        PositiveFloat | None, doc("Largest move per command from the measured position (joint units).")
    ] = None
    use_degrees: Annotated[bool, doc("Arm joints in degrees (false: LeRobot's -100..100 range).")] = True
    disable_torque_on_disconnect: Annotated[bool, doc("Release torque when the edge disconnects.")] = True
    fps: Annotated[Hertz, doc("Control rate (Hz).")] = 30.0
    baudrate: Annotated[PositiveInt, doc("Bus baud rate.")] = 1_000_000
    timeout_s: Annotated[Seconds, doc("Reply timeout of each bus packet (s).")] = 0.05
    retries: Annotated[NonNegativeInt, doc("Bus retries after a bad or missing reply.", le=10)] = 2

    def check(self) -> None:
        """Exactly one calibration source; camera syntax (every camera needs a device)."""
        if bool(self.calibration) == bool(self.id):
            raise FieldError("calibration" if self.calibration else "id", "give exactly one of calibration or id")
        for entry in _checked_cameras(self.cameras):
            if entry.source is None:
                raise FieldError("cameras", f"camera {entry.name!r} needs a device index or path")


def sim_config(options: SimOptions) -> SimConfig:
    """The `SimConfig` of sim options."""
    cameras = []
    for entry in parse_cameras(options.cameras):
        default = SimCameraConfig(entry.name)
        cameras.append(
            SimCameraConfig(
                entry.name,
                height=entry.height or default.height,
                width=entry.width or default.width,
                fps=entry.fps or default.fps,
            )
        )
    extra: dict[str, Any] = {} if options.initial_pose is None else {"initial_pose": options.initial_pose}
    if options.joints:
        units = options.units * len(options.joints) if len(options.units) == 1 else options.units
        extra["joints"] = SimJoints.generic(options.joints, units)
    return SimConfig(
        fps=options.fps,
        cameras=tuple(cameras),
        time_constant_s=options.time_constant_s,
        noise_std=options.noise_std,
        seed=options.seed,
        realtime=options.realtime,
        **extra,
    )


def sim(options: SimOptions) -> RobotParts:
    """Simulated arm with rendered cameras (no hardware): an SO-100, or the policy's joints."""
    config = sim_config(options)

    def cameras(poses: PoseSource) -> Cameras:
        return SimCameras(config, poses)

    return RobotParts(SimSO100(config), cameras)


def _opencv_cameras(options: SOFollowerOptions) -> dict[str, OpenCVCameraConfig]:
    cameras = {}
    for entry in parse_cameras(options.cameras):
        assert entry.source is not None  # SOFollowerOptions.check
        default = OpenCVCameraConfig(entry.source)
        cameras[entry.name] = OpenCVCameraConfig(
            entry.source,
            width=entry.width or default.width,
            height=entry.height or default.height,
            fps=entry.fps or default.fps,
        )
    return cameras


def _so_follower(arm: SOArm, options: SOFollowerOptions) -> RobotParts:
    # The calibration file is loaded here, before any port is touched.
    opencv = _opencv_cameras(options)
    config = SOFollowerConfig(
        port=options.port,
        arm=arm,
        calibration_path=options.calibration or None,
        robot_id=options.id or None,
        write_calibration=options.write_calibration,
        cameras=opencv,
        max_relative_target=options.max_relative_target,
        use_degrees=options.use_degrees,
        disable_torque_on_disconnect=options.disable_torque_on_disconnect,
        fps=options.fps,
        baudrate=options.baudrate,
        timeout_s=options.timeout_s,
        retries=options.retries,
    )

    def cameras(poses: PoseSource) -> Cameras:
        return CameraGroup({name: OpenCVCamera.from_config(cam, name) for name, cam in opencv.items()})

    return RobotParts(SOFollower(config), cameras if opencv else None)


def so100(options: SOFollowerOptions) -> RobotParts:
    """Real SO-100 follower arm (Feetech STS3215 bus, LeRobot calibration)."""
    return _so_follower(SO100_ARM, options)


def so101(options: SOFollowerOptions) -> RobotParts:
    """Real SO-101 follower arm (Feetech STS3215 bus, LeRobot calibration)."""
    return _so_follower(SO101_ARM, options)


def ros2(options: Ros2Options) -> RobotParts:
    """ROS 2 robot over DDS: JointState in, slew-limited targets out, Image cameras (no ROS install)."""
    setup = resolve(options)
    try:
        # Cyclone DDS is an extra: only this robot needs it, and only once it is asked for.
        from .ros2.cameras import Ros2Cameras
        from .ros2.joints import Ros2Joints
    except ImportError as exc:
        raise ConfigError(f"robot 'ros2' needs Cyclone DDS: pip install 'servo-robotics[ros2]' ({exc})") from None

    def cameras(poses: PoseSource) -> Cameras:
        return Ros2Cameras(setup)

    return RobotParts(Ros2Joints(setup), cameras if setup.cameras else None)
