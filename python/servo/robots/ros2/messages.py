"""The ROS 2 messages servo exchanges, declared as Cyclone DDS IDL structs under their ROS 2 names.

ROS 2 nodes on DDS (rmw_cyclonedds, rmw_fastrtps) name the DDS type of ``pkg/msg/Name`` as
``pkg::msg::dds_::Name_`` and serialise it as plain CDR (XCDR1, little-endian, final structs), so
these declarations put the same bytes on the wire as a ROS 2 node does
(`tests/robots/ros2/test_messages.py` checks every one against rosbags' ROS 2 type store).

Field types follow the ``.msg`` definitions: ``int32``/``uint32``/``uint8`` as annotated ints,
``float64[]`` as ``sequence[float64]``, ``string`` as ``str``. JointState (on every tick) and the
two image messages (their pixels, ``uint8[] data``, as ``bytes``) have their own codec
(`servo.robots.ros2.cdr`): Cyclone's generic one walks a message element by element, which a
tick and a 640x480 frame cannot afford.
"""

# No ``from __future__ import annotations`` here: Cyclone's IDL builder resolves the field
# annotations at run time, and string annotations of the builtins do not resolve there.
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Self

from cyclonedds.idl import IdlStruct
from cyclonedds.idl.types import float64, int32, sequence, uint8, uint32

from . import cdr

if TYPE_CHECKING:
    ByteSequence = bytes
else:
    # The type DDS announces (XTypes) is ``sequence<uint8>``; the value is always ``bytes``.
    ByteSequence = sequence[uint8]


@dataclass
class Time(IdlStruct, typename="builtin_interfaces::msg::dds_::Time_"):
    """``builtin_interfaces/Time``: a ROS clock instant (the sender's clock, never compared with ours)."""

    sec: int32 = 0
    nanosec: uint32 = 0


@dataclass
class Duration(IdlStruct, typename="builtin_interfaces::msg::dds_::Duration_"):
    """``builtin_interfaces/Duration``."""

    sec: int32 = 0
    nanosec: uint32 = 0


@dataclass
class Header(IdlStruct, typename="std_msgs::msg::dds_::Header_"):
    """``std_msgs/Header``."""

    stamp: Time = field(default_factory=Time)
    frame_id: str = ""


@dataclass
class JointState(IdlStruct, typename="sensor_msgs::msg::dds_::JointState_"):
    """``sensor_msgs/JointState``: positions in rad (revolute) or m (prismatic), by joint name."""

    header: Header = field(default_factory=Header)
    name: sequence[str] = field(default_factory=list)
    position: sequence[float64] = field(default_factory=list)
    velocity: sequence[float64] = field(default_factory=list)
    effort: sequence[float64] = field(default_factory=list)

    def serialize(self, buffer: Any = None, endianness: Any = None, use_version_2: bool | None = None) -> bytes:
        """CDR with its encapsulation header (see `servo.robots.ros2.cdr`)."""
        if buffer is not None:
            raise ValueError("JointState serialises into a new buffer only")
        stamp = self.header.stamp
        values = [stamp.sec, stamp.nanosec, self.header.frame_id, self.name, self.position, self.velocity, self.effort]
        return cdr.encode(values, cdr.JOINT_STATE, endianness=endianness, use_version_2=use_version_2)

    @classmethod
    def deserialize(cls, data: bytes, has_header: bool = True, use_version_2: bool | None = None) -> Self:
        """Decode CDR, refusing a truncated or malformed buffer with `ValueError`."""
        sec, nanosec, frame_id, *rest = cdr.decode(
            data, cdr.JOINT_STATE, has_header=has_header, use_version_2=use_version_2
        )
        return cls(Header(Time(sec, nanosec), frame_id), *rest)


@dataclass
class MultiArrayDimension(IdlStruct, typename="std_msgs::msg::dds_::MultiArrayDimension_"):
    """``std_msgs/MultiArrayDimension``."""

    label: str = ""
    size: uint32 = 0
    stride: uint32 = 0


@dataclass
class MultiArrayLayout(IdlStruct, typename="std_msgs::msg::dds_::MultiArrayLayout_"):
    """``std_msgs/MultiArrayLayout``."""

    dim: sequence[MultiArrayDimension] = field(default_factory=list)
    data_offset: uint32 = 0


@dataclass
class Float64MultiArray(IdlStruct, typename="std_msgs::msg::dds_::Float64MultiArray_"):
    """``std_msgs/Float64MultiArray``: what ros2_control's forward command controllers take."""

    layout: MultiArrayLayout = field(default_factory=MultiArrayLayout)
    data: sequence[float64] = field(default_factory=list)


@dataclass
class JointTrajectoryPoint(IdlStruct, typename="trajectory_msgs::msg::dds_::JointTrajectoryPoint_"):
    """``trajectory_msgs/JointTrajectoryPoint``."""

    positions: sequence[float64] = field(default_factory=list)
    velocities: sequence[float64] = field(default_factory=list)
    accelerations: sequence[float64] = field(default_factory=list)
    effort: sequence[float64] = field(default_factory=list)
    time_from_start: Duration = field(default_factory=Duration)


@dataclass
class JointTrajectory(IdlStruct, typename="trajectory_msgs::msg::dds_::JointTrajectory_"):
    """``trajectory_msgs/JointTrajectory``: what joint_trajectory_controller takes."""

    header: Header = field(default_factory=Header)
    joint_names: sequence[str] = field(default_factory=list)
    points: sequence[JointTrajectoryPoint] = field(default_factory=list)


@dataclass
class Image(IdlStruct, typename="sensor_msgs::msg::dds_::Image_"):
    """``sensor_msgs/Image``: raw pixels, ``step`` bytes per row."""

    header: Header = field(default_factory=Header)
    height: uint32 = 0
    width: uint32 = 0
    encoding: str = ""
    is_bigendian: uint8 = 0
    step: uint32 = 0
    data: ByteSequence = b""

    def serialize(self, buffer: Any = None, endianness: Any = None, use_version_2: bool | None = None) -> bytes:
        """CDR with its encapsulation header (see `servo.robots.ros2.cdr`)."""
        if buffer is not None:
            raise ValueError("Image serialises into a new buffer only")
        stamp = self.header.stamp
        values = [stamp.sec, stamp.nanosec, self.header.frame_id, self.height, self.width, self.encoding]
        values += [self.is_bigendian, self.step, self.data]
        return cdr.encode(values, cdr.IMAGE, endianness=endianness, use_version_2=use_version_2)

    @classmethod
    def deserialize(cls, data: bytes, has_header: bool = True, use_version_2: bool | None = None) -> Self:
        """Decode CDR, refusing a truncated or malformed buffer with `ValueError`."""
        sec, nanosec, frame_id, *rest = cdr.decode(data, cdr.IMAGE, has_header=has_header, use_version_2=use_version_2)
        return cls(Header(Time(sec, nanosec), frame_id), *rest)


@dataclass
class CompressedImage(IdlStruct, typename="sensor_msgs::msg::dds_::CompressedImage_"):
    """``sensor_msgs/CompressedImage``: ``format`` as image_transport writes it, e.g. ``rgb8; jpeg compressed bgr8``."""

    header: Header = field(default_factory=Header)
    format: str = ""
    data: ByteSequence = b""

    def serialize(self, buffer: Any = None, endianness: Any = None, use_version_2: bool | None = None) -> bytes:
        """CDR with its encapsulation header (see `servo.robots.ros2.cdr`)."""
        if buffer is not None:
            raise ValueError("CompressedImage serialises into a new buffer only")
        stamp = self.header.stamp
        values = [stamp.sec, stamp.nanosec, self.header.frame_id, self.format, self.data]
        return cdr.encode(values, cdr.COMPRESSED_IMAGE, endianness=endianness, use_version_2=use_version_2)

    @classmethod
    def deserialize(cls, data: bytes, has_header: bool = True, use_version_2: bool | None = None) -> Self:
        """Decode CDR, refusing a truncated or malformed buffer with `ValueError`."""
        sec, nanosec, frame_id, text, pixels = cdr.decode(
            data, cdr.COMPRESSED_IMAGE, has_header=has_header, use_version_2=use_version_2
        )
        return cls(Header(Time(sec, nanosec), frame_id), text, pixels)


#: The message classes by ROS 2 type name, as options name them.
BY_ROS_NAME: dict[str, type[IdlStruct]] = {
    "sensor_msgs/JointState": JointState,
    "std_msgs/Float64MultiArray": Float64MultiArray,
    "trajectory_msgs/JointTrajectory": JointTrajectory,
    "sensor_msgs/Image": Image,
    "sensor_msgs/CompressedImage": CompressedImage,
}

#: REP-2016 type hashes (RIHS01) of the messages, as rmw_zenoh puts them in its key expressions;
#: the same from Iron to Rolling (checked against rosbags' type stores).
TYPE_HASHES: dict[str, str] = {
    JointState.__idl_typename__: "RIHS01_a13ee3a330e346c9d87b5aa18d24e11690752bd33a0350f11c5882bc9179260e",
    Float64MultiArray.__idl_typename__: "RIHS01_1025ddc6b9552d191f89ef1a8d2f60f3d373e28b283d8891ddcc974e8c55397f",
    JointTrajectory.__idl_typename__: "RIHS01_179b33eba59d676f6d967ac71fe35e7ca2f64b2f3928f4a018cec115e213796e",
    Image.__idl_typename__: "RIHS01_d31d41a9a4c4bc8eae9be757b0beed306564f7526c88ea6a4588fb9582527d47",
    CompressedImage.__idl_typename__: "RIHS01_15640771531571185e2efc8a100baf923961a4d15d5569652e6cb6691e8e371a",
}
