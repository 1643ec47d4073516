"""``servo-edge --display``: the run, live, in a Rerun viewer (or an ``.rrd`` file).

Everything shown already reaches the main process: the control loop's tick records (measured
state and the command sent, through the `ControlChannel` ring the recorder also reads), the
engine's statistics (state, queue depth, delay steps, round trip) and the cameras' newest
frames. So the control loop does nothing more for the display than it does for a recording,
and the event loop only hands each drained batch over::

    event loop (every drain, 50 ms)                display thread (owns the Rerun stream)
    ticks + engine statistics ──offer()──► inbox ──► joints/<joint>/{measured,commanded}
      (bounded: dropped and counted                   engine/{queue_depth,delay_steps,rtt_ms,state}
       when the thread lags)                          cameras/<cam>: newest frames, JPEG, at
                                                      most camera_fps per second

Rerun (``pip install 'servo-robotics[rerun]'``) is imported only when a display is asked for.
Entities live on two timelines: ``tick`` (the control tick) and ``time`` (seconds since the
first tick, monotonic clock).
"""

from __future__ import annotations

import contextlib
import importlib
import os
import queue
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Annotated, Any

import msgspec
import numpy as np
import numpy.typing as npt

from servo.config import ConfigError, PositiveFloat, Quality, doc
from servo.logs import get_logger
from servo.private_files import private_opener
from servo.robots.protocol import Cameras, RobotSpec
from servo.wire.image import encode_image

if TYPE_CHECKING:
    from servo.edge.channel import Tick
    from servo.edge.stats import EngineStats

log = get_logger(__name__)

INSTALL_HINT = "pip install 'servo-robotics[rerun]'"
#: Batches waiting for the display thread (50 ms each: 3 s) before new ones are dropped.
INBOX_BATCHES = 64
#: How long `Display.close` waits for the display thread to log what is queued.
CLOSE_TIMEOUT_S = 5.0


class DisplayConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """Where the live view goes (each field is a ``--display…`` flag of servo-edge)."""

    spawn: Annotated[bool, doc("Spawn a Rerun viewer here (or use the one already listening on its port).")] = False
    connect: Annotated[str, doc("Stream to a Rerun viewer elsewhere, e.g. rerun+http://laptop:9876/proxy.")] = ""
    save: Annotated[str, doc("Write the live view to this .rrd file (open it later with `rerun FILE`).")] = ""
    camera_fps: Annotated[
        PositiveFloat, doc("Camera frames shown per second at most (each is JPEG-encoded).", le=60)
    ] = 5.0
    jpeg_quality: Annotated[Quality, doc("JPEG quality of the frames shown.")] = 75

    @property
    def enabled(self) -> bool:
        """Whether any destination is given."""
        return self.spawn or bool(self.connect) or bool(self.save)


def import_rerun() -> ModuleType:
    """The ``rerun`` module.

    Raises:
        ConfigError: Rerun is not installed (one line saying how to install it).
    """
    try:
        return importlib.import_module("rerun")
    except ImportError:
        raise ConfigError(f"--display needs Rerun, which is not installed: {INSTALL_HINT}") from None


@dataclass(frozen=True)
class _Batch:
    """One drain's worth of ticks as arrays, and the engine statistics at that drain. Immutable."""

    ticks: npt.NDArray[np.int64]
    mono_ns: npt.NDArray[np.int64]
    measured: npt.NDArray[np.float32]  # (T, joints)
    commanded_at: npt.NDArray[np.bool_]  # (T,): a command was sent at that tick
    commanded: npt.NDArray[np.float32]  # (commands, joints)
    stats: EngineStats


_STOP = object()


class Display:
    """Streams a run to Rerun (see the module docstring).

    The edge's event loop calls `start` (from a worker thread: spawning a viewer blocks), `offer`
    and `close`; the display thread owns the Rerun recording stream and reads the cameras
    (`Cameras.read_cameras` never waits). A Rerun error stops the display, never the run.

    ::

        created ──start()──► streaming ──close()──► closed
                                 │
                                 └── a Rerun error ──► failed (offers ignored; logged once)
    """

    def __init__(self, config: DisplayConfig) -> None:
        """Import Rerun; nothing is opened until `start`.

        Raises:
            ConfigError: Rerun is not installed.
        """
        self.config = config
        self._rr = import_rerun()
        self._inbox: queue.Queue[object] = queue.Queue(INBOX_BATCHES)
        self._thread: threading.Thread | None = None
        self._stream: Any = None
        self._joints: list[str] = []
        self._cameras: Cameras | None = None
        self._origin_ns: int | None = None
        self._last_tick = 0
        self._last_ns = 0
        self._state = ""
        self._codec = ""
        #: Batches dropped because the display thread lagged.
        self.dropped = 0
        #: Why the display stopped early ("" while it works).
        self.failure = ""

    def start(self, spec: RobotSpec, cameras: Cameras) -> None:
        """Open the destinations, send the layout and start the display thread.

        Raises:
            ConfigError: a destination cannot be opened (no viewer to spawn, unwritable file).
        """
        rr = self._rr
        self._joints = [rr.escape_entity_path_part(name) for name in spec.joint_names]
        self._cameras = cameras
        stream = rr.RecordingStream("servo-edge")
        sinks = self._sinks(stream)
        try:
            stream.set_sinks(*sinks, default_blueprint=self._blueprint(spec))
        except Exception as exc:
            raise ConfigError(f"--display: {type(exc).__name__}: {exc}") from None
        for joint in self._joints:
            stream.log(f"joints/{joint}/measured", rr.SeriesLines(names="measured"), static=True)
            stream.log(f"joints/{joint}/commanded", rr.SeriesLines(names="commanded"), static=True)
        self._stream = stream
        self._thread = threading.Thread(target=self._run, name="servo-display", daemon=True)
        self._thread.start()
        log.info("display started", destinations=self._describe())

    def offer(self, ticks: list[Tick], stats: EngineStats) -> None:
        """Event loop: hand over one drain's ticks and the engine statistics (never waits)."""
        if self._thread is None or self.failure:
            return
        dim = len(self._joints)
        commands = [t.action for t in ticks if t.action is not None]
        batch = _Batch(
            ticks=np.fromiter((t.tick for t in ticks), np.int64, len(ticks)),
            mono_ns=np.fromiter((t.mono_ns for t in ticks), np.int64, len(ticks)),
            measured=np.stack([t.state for t in ticks]) if ticks else np.empty((0, dim), np.float32),
            commanded_at=np.fromiter((t.action is not None for t in ticks), np.bool_, len(ticks)),
            commanded=np.stack(commands) if commands else np.empty((0, dim), np.float32),
            stats=stats,
        )
        try:
            self._inbox.put_nowait(batch)
        except queue.Full:
            self.dropped += 1

    def close(self) -> None:
        """Log what is queued, flush the destinations and stop the thread. Idempotent.

        Blocks at most about twice `CLOSE_TIMEOUT_S`: a viewer that went away cannot hold up the
        edge's teardown (the thread, a daemon, is then left behind with what it could not send).
        """
        thread, self._thread = self._thread, None
        if thread is None:
            return
        with contextlib.suppress(queue.Full):
            self._inbox.put(_STOP, timeout=CLOSE_TIMEOUT_S)
        thread.join(CLOSE_TIMEOUT_S + 1.0)
        if thread.is_alive():
            log.error("display did not finish in time; leaving it", timeout_s=CLOSE_TIMEOUT_S)
            return
        log.info("display closed", dropped_batches=self.dropped)

    # ------------------------------------------------------------------ display thread
    def _run(self) -> None:
        try:
            self._serve()
        except Exception as exc:
            self.failure = f"{type(exc).__name__}: {exc}"
            log.error("display stopped; the run goes on", error=self.failure)
            while self._inbox.get() is not _STOP:  # keep close() from waiting on a full inbox
                pass
            return
        try:
            try:
                self._stream.flush(timeout_sec=CLOSE_TIMEOUT_S)
            except TypeError:  # rerun < 0.25 has no timeout: flush(blocking=True)
                self._stream.flush()
            self._stream.disconnect()
        except Exception as exc:  # a viewer that is not there: what it did not get is lost
            log.warning("display could not deliver everything", error=str(exc))

    def _serve(self) -> None:
        """Log batches as they come and the cameras' frames every camera period, until `_STOP`."""
        period = 1.0 / self.config.camera_fps
        next_frames = 0.0  # the first frames go out with the first ticks
        while True:
            started = self._origin_ns is not None
            wait = max(0.0, next_frames - time.monotonic()) if started else period
            try:
                item = self._inbox.get(timeout=wait)
            except queue.Empty:
                item = None
            if item is _STOP:
                return
            if isinstance(item, _Batch):
                self._log_batch(item)
            if self._origin_ns is not None and time.monotonic() >= next_frames:
                self._log_frames()
                next_frames = time.monotonic() + period

    def _set_time(self, tick: int, mono_ns: int) -> None:
        assert self._origin_ns is not None
        self._stream.set_time("tick", sequence=tick)
        self._stream.set_time("time", duration=(mono_ns - self._origin_ns) / 1e9)

    def _log_batch(self, batch: _Batch) -> None:
        rr, stream = self._rr, self._stream
        if len(batch.ticks):
            if self._origin_ns is None:
                self._origin_ns = int(batch.mono_ns[0])
            seconds = (batch.mono_ns - self._origin_ns) / 1e9
            self._last_tick, self._last_ns = int(batch.ticks[-1]), int(batch.mono_ns[-1])
            sent = batch.commanded_at
            for index, joint in enumerate(self._joints):
                stream.send_columns(
                    f"joints/{joint}/measured",
                    indexes=[rr.TimeColumn("tick", sequence=batch.ticks), rr.TimeColumn("time", duration=seconds)],
                    columns=rr.Scalars.columns(scalars=batch.measured[:, index].astype(np.float64)),
                )
                if sent.any():
                    stream.send_columns(
                        f"joints/{joint}/commanded",
                        indexes=[
                            rr.TimeColumn("tick", sequence=batch.ticks[sent]),
                            rr.TimeColumn("time", duration=seconds[sent]),
                        ],
                        columns=rr.Scalars.columns(scalars=batch.commanded[:, index].astype(np.float64)),
                    )
        if self._origin_ns is None:
            return  # no tick yet: nothing to place the statistics at
        self._set_time(self._last_tick, self._last_ns)
        stats = batch.stats
        stream.log("engine/queue_depth", rr.Scalars(float(stats.queue_depth)))
        stream.log("engine/delay_steps", rr.Scalars(float(stats.delay_steps)))
        if stats.rtt_ms_p50 is not None:
            stream.log("engine/rtt_ms", rr.Scalars(stats.rtt_ms_p50))
        if stats.codec is not None:
            if stats.codec.link_mbps is not None:
                stream.log("engine/link_mbps", rr.Scalars(stats.codec.link_mbps))
            if stats.codec.current != self._codec:
                self._codec = stats.codec.current
                stream.log("engine/codec", rr.TextLog(stats.codec.current))
        if stats.state != self._state:
            self._state = stats.state
            stream.log("engine/state", rr.TextLog(stats.state))

    def _log_frames(self) -> None:
        assert self._cameras is not None
        frames = self._cameras.read_cameras()
        if not frames:
            return
        rr = self._rr
        self._set_time(self._last_tick, self._last_ns)
        for name, frame in frames.items():
            jpeg = encode_image(frame, self.config.jpeg_quality)
            self._stream.log(
                f"cameras/{rr.escape_entity_path_part(name)}",
                rr.EncodedImage(contents=bytes(jpeg.data), media_type="image/jpeg"),
            )

    # ------------------------------------------------------------------ set-up
    def _sinks(self, stream: Any) -> list[Any]:
        rr, config = self._rr, self.config
        sinks: list[Any] = []
        if config.save:
            path = Path(config.save)
            if not path.parent.is_dir():
                raise ConfigError(f"--display-save: directory {str(path.parent)!r} does not exist")
            # Rerun creates its file with the umask's mode; the camera frames in it are this user's alone.
            os.close(private_opener(str(path), os.O_WRONLY | os.O_CREAT))
            sinks.append(rr.FileSink(str(path)))
        if config.connect:
            sinks.append(rr.GrpcSink(config.connect))
        if config.spawn:
            if sys.platform == "linux" and not (os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY")):
                # Rerun would start a viewer that exits at once, and stream to nobody.
                raise ConfigError(
                    "--display: this machine has no screen (neither DISPLAY nor WAYLAND_DISPLAY is set); use "
                    "--display-connect rerun+http://HOST:9876/proxy for a viewer elsewhere, or --display-save FILE.rrd"
                )
            # The viewer installed beside this interpreter, or the first on PATH.
            beside = Path(sys.executable).with_name("rerun")
            try:
                rr.spawn(connect=False, executable_path=str(beside) if beside.is_file() else None, recording=stream)
            except Exception as exc:
                raise ConfigError(
                    f"--display: cannot spawn a Rerun viewer ({type(exc).__name__}: {exc}); on a machine without "
                    "a screen use --display-connect (a viewer elsewhere) or --display-save"
                ) from None
            sinks.append(rr.GrpcSink())
        return sinks

    def _describe(self) -> list[str]:
        config = self.config
        return [
            *([f"file {config.save}"] if config.save else []),
            *([f"viewer {config.connect}"] if config.connect else []),
            *(["spawned viewer"] if config.spawn else []),
        ]

    def _blueprint(self, spec: RobotSpec) -> Any:
        rrb = importlib.import_module("rerun.blueprint")
        cameras = [
            rrb.Spatial2DView(origin=f"cameras/{self._rr.escape_entity_path_part(name)}", name=name)
            for name in spec.cameras
        ]
        joints = [
            rrb.TimeSeriesView(origin=f"joints/{joint}", name=name)
            for joint, name in zip(self._joints, spec.joint_names, strict=True)
        ]
        engine = rrb.Vertical(
            rrb.TimeSeriesView(origin="engine/queue_depth", name="queue depth (actions)"),
            rrb.TimeSeriesView(origin="engine/delay_steps", name="inference delay (steps)"),
            rrb.TimeSeriesView(origin="engine/rtt_ms", name="round trip p50 (ms)"),
            rrb.TextLogView(origin="engine/state", name="engine state"),
        )
        columns = [rrb.Vertical(*cameras)] if cameras else []
        return rrb.Blueprint(rrb.Horizontal(*columns, rrb.Grid(*joints), engine), collapse_panels=True)
