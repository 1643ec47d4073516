"""A simulated ROS 2 arm on Cyclone DDS: what ``servo-edge --robot ros2`` drives when no robot is at hand.

``python -m servo.robots.ros2.sim_node --joints j1,j2,j3`` behaves like a ros2_control arm with a
joint_state_broadcaster and a position command topic: it publishes ``sensor_msgs/JointState`` at
``--rate`` Hz with its own joint names in its own order, follows the newest target it received
with a rate-limited first-order lag (`servo.robots.sim.first_order_step`), publishes camera images
(``sensor_msgs/Image`` rgb8/bgr8, or ``CompressedImage`` JPEG on a ``…/compressed`` topic), and
with ``--record FILE`` writes every target it received as a JSON line (its arrival on this
process's monotonic clock, the joint names, the positions), so a test can check what reached it.

Its header stamps come from its own ROS clock: seconds since it started with ``--sim-time`` (as a
simulator's ``/clock`` would), else its wall clock. It prints ``READY`` once its endpoints exist,
and ends on SIGTERM, SIGINT or after ``--duration`` seconds.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import sys
import threading
import time
from collections.abc import Sequence
from typing import IO, Any

import numpy as np
import numpy.typing as npt
import simplejpeg

from servo.robots.camera_list import parse_cameras
from servo.robots.sim import first_order_step

from .dds import DdsLink
from .link import Link, Writer
from .messages import (
    BY_ROS_NAME,
    TYPE_HASHES,
    CompressedImage,
    Float64MultiArray,
    Header,
    Image,
    JointState,
    JointTrajectory,
    Time,
)
from .options import ros_name
from .rmw_zenoh import ZenohLink, entity_token

F64 = npt.NDArray[np.float64]
#: The QoS part of its liveliness tokens: design.md's example (servo never parses it).
_QOS = "::,10:,:,:,,"
_COMMANDS = ("sensor_msgs/JointState", "std_msgs/Float64MultiArray", "trajectory_msgs/JointTrajectory")


def _floats(text: str) -> list[float]:
    return [float(item) for item in text.split(",") if item.strip()]


def build_parser() -> argparse.ArgumentParser:
    """The node's command line."""
    parser = argparse.ArgumentParser(prog="python -m servo.robots.ros2.sim_node", description=__doc__)
    parser.add_argument("--joints", required=True, help="Its joint names, in its order (comma-separated).")
    parser.add_argument("--initial-pose", type=_floats, help="Start positions in its order (rad, m; default 0).")
    parser.add_argument("--max-velocity", type=float, default=2.0, help="Speed limit of every joint (rad/s).")
    parser.add_argument("--time-constant-s", type=float, default=0.05, help="First-order lag of every joint (s).")
    parser.add_argument("--rate", type=float, default=150.0, help="JointState rate (Hz).")
    parser.add_argument("--state-topic", default="joint_states")
    parser.add_argument("--state-qos", choices=("reliable", "best_effort"), default="reliable")
    parser.add_argument("--command-topic", default="target_joints")
    parser.add_argument("--command-type", choices=_COMMANDS, default=_COMMANDS[0])
    parser.add_argument("--command-joints", help="Float64MultiArray: the joints of its values (default: all).")
    parser.add_argument("--camera", action="append", default=[], help="NAME:TOPIC:WxH[@FPS] (repeatable).")
    parser.add_argument("--bgr", action="store_true", help="Publish raw images as bgr8 instead of rgb8.")
    parser.add_argument("--namespace", default="")
    parser.add_argument(
        "--domain-id",
        type=int,
        default=int(os.environ.get("ROS_DOMAIN_ID", "").strip() or 0),
        help="DDS domain (default: $ROS_DOMAIN_ID, else 0, as a ROS node).",
    )
    parser.add_argument("--transport", choices=("dds", "zenoh"), default="dds")
    parser.add_argument("--zenoh-connect", default="tcp/localhost:7447", help="transport zenoh: the router.")
    parser.add_argument("--sim-time", action="store_true", help="Stamp headers with seconds since start.")
    parser.add_argument("--record", help="Write every received target to this file as a JSON line.")
    parser.add_argument("--duration", type=float, default=600.0, help="End after this many seconds.")
    parser.add_argument("--realtime", type=int, metavar="PRIORITY", help="Run under SCHED_FIFO (as drivers do).")
    return parser


class _Camera:
    """One simulated camera: renders a frame from the arm's pose, publishes it. Owned by the node's loop."""

    def __init__(self, writer: Writer, spec: str, *, bgr: bool) -> None:
        (entry,) = parse_cameras(spec)
        if not isinstance(entry.source, str) or entry.width is None or entry.height is None:
            raise SystemExit(f"--camera {spec!r}: needs NAME:TOPIC:WxH[@FPS]")
        self.topic = entry.source
        self.height, self.width = entry.height, entry.width
        self.period_ns = round(1e9 / (entry.fps or 30.0))
        self.next_ns = 0
        self.compressed = entry.source.endswith("/compressed")
        self.bgr = bgr
        self.writer = writer
        ramp = np.broadcast_to(np.linspace(0, 150, self.width).astype(np.uint8), (self.height, self.width))
        self._base = np.ascontiguousarray(np.stack([ramp, np.zeros_like(ramp), 255 - ramp], axis=-1))

    def publish(self, now_ns: int, header: Header, pose: F64) -> None:
        if now_ns < self.next_ns:
            return
        self.next_ns = now_ns + self.period_ns
        # Red ramps up left to right, blue down; red and green brighten with the first joint, so
        # the frames change as the arm moves.
        rgb = self._base.copy()
        shade = np.uint8((np.tanh(pose[0]) + 1.0) * 50.0)
        rgb[..., :2] += shade
        if self.compressed:
            data = simplejpeg.encode_jpeg(rgb, quality=90, colorspace="RGB")
            self.writer.write(CompressedImage(header, "rgb8; jpeg compressed bgr8", data))
        else:
            pixels = rgb[..., ::-1] if self.bgr else rgb
            encoding = "bgr8" if self.bgr else "rgb8"
            self.writer.write(
                Image(
                    header, self.height, self.width, encoding, 0, 3 * self.width, np.ascontiguousarray(pixels).tobytes()
                )
            )


class SimNode:
    """The simulated arm (see the module docstring). Owned by the thread that calls `run`."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.names = [name.strip() for name in args.joints.split(",") if name.strip()]
        n = len(self.names)
        pose = args.initial_pose or [0.0] * n
        if len(pose) != n:
            raise SystemExit(f"--initial-pose has {len(pose)} values for {n} joints")
        self.position: F64 = np.asarray(pose, dtype=np.float64)
        self.target = self.position.copy()
        self.vmax = np.full(n, args.max_velocity)
        self.args = args
        self.command_names = (
            [name.strip() for name in args.command_joints.split(",")] if args.command_joints else self.names
        )
        ns = args.namespace
        self.link = _open(args)
        self._tokens: list[Any] = []
        command_topic = ros_name(args.command_topic, ns, "--command-topic")
        kind = BY_ROS_NAME[args.command_type]
        self.commands = self.link.reader(command_topic, kind, reliable=True, depth=64)
        self._announce("MS", command_topic, kind)
        self.states = self._writer(ros_name(args.state_topic, ns, "--state-topic"), JointState)
        self.cameras = []
        for spec in args.camera:
            (entry,) = parse_cameras(spec)
            image = CompressedImage if str(entry.source).endswith("/compressed") else Image
            writer = self._writer(ros_name(str(entry.source), ns, "--camera"), image)
            self.cameras.append(_Camera(writer, spec, bgr=args.bgr))
        self.received = 0

    def _writer(self, topic: str, kind: type[Any]) -> Writer:
        self._announce("MP", topic, kind)
        return self.link.writer(topic, kind, reliable=self.args.state_qos == "reliable" or kind is not JointState)

    def _announce(self, entity: str, topic: str, kind: type[Any]) -> None:
        """On Zenoh, what every rmw_zenoh node declares: a liveliness token per endpoint (design.md)."""
        if isinstance(self.link, ZenohLink):
            session = self.link.session
            node = f"{self.args.namespace.rstrip('/')}/sim_arm"
            topic_type = f"{topic}:{kind.__idl_typename__}"
            type_hash = TYPE_HASHES[kind.__idl_typename__]
            key = entity_token(
                self.args.domain_id,
                str(session.zid()),
                10 + len(self._tokens),
                entity,
                node,
                topic_type,
                type_hash,
                _QOS,
            )
            self._tokens.append(session.liveliness().declare_token(key))

    def stamp(self, now_ns: int, start_ns: int) -> Header:
        """A header on this node's ROS clock (never the edge's)."""
        ns = now_ns - start_ns if self.args.sim_time else time.time_ns()
        return Header(Time(ns // 1_000_000_000, ns % 1_000_000_000), "base_link")

    def take_targets(self, now_ns: int, record: IO[str] | None) -> None:
        """Apply (and record) every target received since the last call, oldest first."""
        for sample in self.commands.take(64):
            named = _named_positions(sample, self.command_names)
            if named is None:
                continue
            names, positions = named
            self.received += 1
            if record is not None:
                record.write(json.dumps({"mono_ns": now_ns, "names": names, "positions": positions}) + "\n")
            for name, value in zip(names, positions, strict=False):
                if name in self.names and np.isfinite(value):
                    self.target[self.names.index(name)] = value

    def run(self, stop: threading.Event) -> None:
        """Publish, follow and record until ``stop`` or ``--duration``."""
        args = self.args
        period_ns = round(1e9 / args.rate)
        start = next_ns = time.monotonic_ns()
        end = start + round(args.duration * 1e9)
        last = start
        with open(args.record, "w", buffering=1) if args.record else contextlib.nullcontext() as record:
            try:
                print("READY", flush=True)
                while not stop.is_set() and next_ns < end:
                    now = time.monotonic_ns()
                    self.take_targets(now, record)
                    self.position = first_order_step(
                        self.position, self.target, (now - last) / 1e9, args.time_constant_s, self.vmax
                    )
                    last = now
                    header = self.stamp(now, start)
                    self.states.write(JointState(header, list(self.names), self.position.tolist(), [], []))
                    for camera in self.cameras:
                        camera.publish(now, header, self.position)
                    next_ns += period_ns
                    stop.wait(max(next_ns - time.monotonic_ns(), 0) / 1e9)
            finally:
                self.link.close()


def _open(args: argparse.Namespace) -> Link:
    if args.transport == "zenoh":
        return ZenohLink(args.domain_id, [args.zenoh_connect])
    return DdsLink(args.domain_id)


def _named_positions(sample: Any, command_names: Sequence[str]) -> tuple[list[str], list[float]] | None:
    if isinstance(sample, JointState):
        return list(sample.name), list(sample.position)
    if isinstance(sample, Float64MultiArray):
        return list(command_names), list(sample.data)
    if isinstance(sample, JointTrajectory) and sample.points:
        return list(sample.joint_names), list(sample.points[-1].positions)
    return None


def main(argv: list[str] | None = None) -> int:
    """Entry point (``python -m servo.robots.ros2.sim_node``)."""
    args = build_parser().parse_args(argv)
    if args.realtime is not None:
        # A driver runs at real-time priority (ros2_control's default is 50): best effort here.
        with contextlib.suppress(AttributeError, OSError):
            os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(args.realtime))
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    SimNode(args).run(stop)
    return 0


if __name__ == "__main__":
    sys.exit(main())
