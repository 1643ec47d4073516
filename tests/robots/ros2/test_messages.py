"""Every ROS 2 message servo exchanges is byte-for-byte what a ROS 2 node puts on the wire.

The reference is rosbags' ROS 2 type store (an independent CDR implementation built from the
``.msg`` definitions): our bytes must equal its serialisation, and each side must decode the
other's bytes to the same message.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("cyclonedds")
pytest.importorskip("rosbags")

from rosbags.typesys import Stores, get_typestore
from rosbags.typesys.base import Nodetype

from servo.robots.ros2 import messages as m

STORES = [Stores.ROS2_HUMBLE, Stores.ROS2_JAZZY]

int32 = st.integers(-(2**31), 2**31 - 1)
uint32 = st.integers(0, 2**32 - 1)
text = st.text(st.characters(codec="utf-8", exclude_characters="\0"), max_size=12)
floats = st.lists(st.floats(allow_nan=False), max_size=8)
blob = st.binary(max_size=64)
header = st.builds(m.Header, st.builds(m.Time, int32, uint32), text)

MESSAGES: dict[str, st.SearchStrategy[Any]] = {
    "sensor_msgs/msg/JointState": st.builds(m.JointState, header, st.lists(text, max_size=8), floats, floats, floats),
    "std_msgs/msg/Float64MultiArray": st.builds(
        m.Float64MultiArray,
        st.builds(
            m.MultiArrayLayout,
            st.lists(st.builds(m.MultiArrayDimension, text, uint32, uint32), max_size=3),
            uint32,
        ),
        floats,
    ),
    "trajectory_msgs/msg/JointTrajectory": st.builds(
        m.JointTrajectory,
        header,
        st.lists(text, max_size=6),
        st.lists(
            st.builds(m.JointTrajectoryPoint, floats, floats, floats, floats, st.builds(m.Duration, int32, uint32)),
            max_size=3,
        ),
    ),
    "sensor_msgs/msg/Image": st.builds(m.Image, header, uint32, uint32, text, st.integers(0, 255), uint32, blob),
    "sensor_msgs/msg/CompressedImage": st.builds(m.CompressedImage, header, text, blob),
}


def to_rosbags(store: Any, value: Any, typename: str) -> Any:
    """The same message as a rosbags object (arrays of numbers as numpy arrays, as rosbags has them)."""
    kind = store.types[typename]
    fields = {}
    for name, (how, spec) in store.fielddefs[typename][1]:
        fields[name] = convert(store, getattr(value, name), how, spec)
    return kind(**fields)


def convert(store: Any, item: Any, how: int, spec: Any) -> Any:
    if how == Nodetype.NAME:
        return to_rosbags(store, item, spec)
    if how == Nodetype.SEQUENCE:
        (inner_how, inner_spec), _ = spec
        if inner_how == Nodetype.BASE and inner_spec[0] != "string":
            dtype = {"float64": np.float64, "uint8": np.uint8}[inner_spec[0]]
            return np.frombuffer(item, np.uint8).copy() if isinstance(item, bytes) else np.array(item, dtype)
        return [convert(store, x, inner_how, inner_spec) for x in item]
    return item


@pytest.mark.parametrize("store_name", STORES)
@pytest.mark.parametrize("typename", sorted(MESSAGES))
@settings(max_examples=30, deadline=None)
@given(data=st.data())
def test_same_cdr_as_rosbags(store_name: Any, typename: str, data: st.DataObject) -> None:
    store = get_typestore(store_name)
    ours = data.draw(MESSAGES[typename])
    assert ours.__idl_typename__ == typename.replace("/msg/", "::msg::dds_::") + "_"
    theirs = to_rosbags(store, ours, typename)
    wire = ours.serialize()
    assert wire[:4] == b"\x00\x01\x00\x00"  # CDR_LE encapsulation, what ROS 2 sends
    assert wire == bytes(store.serialize_cdr(theirs, typename))
    assert type(ours).deserialize(bytes(store.serialize_cdr(theirs, typename))) == ours
    back = store.deserialize_cdr(wire, typename)
    assert bytes(store.serialize_cdr(back, typename)) == wire
    # A big-endian publisher is rare, but its messages are the same messages.
    big = bytes(store.serialize_cdr(theirs, typename, little_endian=False))
    assert type(ours).deserialize(big) == ours


@pytest.mark.parametrize("typename", ["sensor_msgs/msg/JointState", "sensor_msgs/msg/Image"])
@pytest.mark.parametrize("version_2", [False, True])
@settings(max_examples=20, deadline=None)
@given(data=st.data())
def test_our_codec_is_cyclones_in_both_cdr_versions(typename: str, version_2: bool, data: st.DataObject) -> None:
    """XCDR2 (which rosbags does not write) against Cyclone's own generic codec, both byte orders."""
    from cyclonedds.idl._support import Endianness

    message = data.draw(MESSAGES[typename])
    if typename.endswith("Image"):
        message.data = list(message.data)  # the generic codec takes uint8[] as ints
    for order in (Endianness.Little, Endianness.Big):
        generic = type(message).__idl__.serialize(message, endianness=order, use_version_2=version_2)
        decoded = type(message).deserialize(generic)
        assert decoded.serialize(endianness=order, use_version_2=version_2) == generic


@pytest.mark.parametrize("kind", [m.JointState, m.Image, m.CompressedImage])
@settings(max_examples=300, deadline=None)
@given(raw=st.binary(max_size=96))
def test_a_hostile_buffer_is_a_value_error_or_a_message(kind: type[Any], raw: bytes) -> None:
    """These codecs are ours (servo.robots.ros2.cdr): any bytes decode or raise ValueError."""
    for data in (raw, b"\x00\x01\x00\x00" + raw):
        try:
            message = kind.deserialize(data)
        except ValueError:
            continue
        assert kind.deserialize(message.serialize()) == message


def test_image_codec_refuses_truncation_and_unterminated_strings() -> None:
    wire = m.Image(m.Header(m.Time(1, 2), "cam"), 2, 3, "rgb8", 0, 9, bytes(range(18))).serialize()
    with pytest.raises(ValueError, match="claims 18 bytes"):
        m.Image.deserialize(wire[:-1])
    with pytest.raises(ValueError, match="ends at offset"):
        m.Image.deserialize(wire[:10])
    unterminated = bytearray(wire)
    unterminated[wire.index(b"cam") + 3] = ord("!")
    with pytest.raises(ValueError, match="does not end in NUL"):
        m.Image.deserialize(bytes(unterminated))
    with pytest.raises(ValueError, match="not a CDR buffer"):
        m.Image.deserialize(b"\x00\x03" + wire[2:])  # a parameter list is not this final struct
