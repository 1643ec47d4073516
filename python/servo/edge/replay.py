"""Trajectory replay (docs/design/replay.md): load the whole trajectory once, drain it locally.

A trajectory comes from a recording file or from a server's library in one control-plane
request; either way nothing crosses the network per frame. At arm time a smooth bridge from
the arm's current pose to the first frame is computed once and queued as ordinary frames; then
the frames drain at the robot's fps through the same queue, control loop and safety limits as
policy actions.
"""

from __future__ import annotations

import math

import anyio
import numpy as np
import numpy.typing as npt

from servo.client import PolicyClient, UntrustedServer
from servo.edge.config import EdgeConfig
from servo.edge.engine import LOCAL_SESSION, EngineBase
from servo.edge.errors import EdgeStartError
from servo.edge.pipeline import Produced, Request
from servo.identity import Identity
from servo.logs import get_logger
from servo.recording import check_rate, read_recording
from servo.robots.protocol import RobotSpec
from servo.transport import open_zsession
from servo.wire import WireError, decode_floats

log = get_logger(__name__)

FloatArray = npt.NDArray[np.float32]

#: Frames handed to the queue per refill (the queue is bounded; trajectories need not be).
REFILL_FRAMES = 256
#: The bridge moves no joint faster than this fraction of its velocity limit.
BRIDGE_SPEED_FRACTION = 0.5
MIN_BRIDGE_S = 0.3


def resample(frames: FloatArray, src_fps: float, dst_fps: float) -> FloatArray:
    """Linear resampling of a (T, D) trajectory to another rate (identity when equal)."""
    if len(frames) < 2 or math.isclose(src_fps, dst_fps):
        return frames.astype(np.float32)
    duration = (len(frames) - 1) / src_fps
    t_src = np.arange(len(frames)) / src_fps
    t_dst = np.arange(round(duration * dst_fps) + 1) / dst_fps
    out = np.stack([np.interp(t_dst, t_src, frames[:, j]) for j in range(frames.shape[1])], axis=1)
    return out.astype(np.float32)


def bridge(start: FloatArray, end: FloatArray, spec: RobotSpec) -> FloatArray:
    """Minimum-jerk frames from ``start`` to ``end`` (excluding ``start``).

    Slow enough that no joint exceeds half its velocity limit.
    """
    vmax = np.asarray(spec.max_velocity, dtype=np.float64) * BRIDGE_SPEED_FRACTION
    distance = np.abs(np.asarray(end, np.float64) - np.asarray(start, np.float64))
    # Minimum-jerk peaks at 1.875x the average speed.
    duration = max(MIN_BRIDGE_S, float(np.max(1.875 * distance / vmax)))
    steps = max(1, math.ceil(duration * spec.fps))
    s = np.arange(1, steps + 1) / steps
    profile = 10 * s**3 - 15 * s**4 + 6 * s**5
    return (start + (end - start) * profile[:, None]).astype(np.float32)


class ReplayEngine(EngineBase):
    """Drains a trajectory at the robot's fps: each request of the engine loop takes the next frames.

    Owned by the event loop. The first request bridges from the arm's pose to the first frame.

    Args:
        config: Edge options: ``[replay]`` names the trajectory (a recording path, or
            ``server:NAME`` for a server's library, fetched with the connection settings) and
            whether to start over (through a bridge) at its end.
        spec: The robot.
    """

    def __init__(self, config: EdgeConfig, spec: RobotSpec) -> None:
        super().__init__(config, spec, client_id=config.resolved_client_id(f"{spec.name}-replay"))
        self.pipeline.set_rtc(False)
        self.pipeline.label_actions("replay")
        self.source = config.replay.trajectory
        self.loop = config.replay.loop
        self.trajectory: FloatArray | None = None
        self._plan: FloatArray | None = None
        #: The client that fetched a ``server:NAME`` trajectory (its statistics count forgeries).
        self.client: PolicyClient | None = None
        self._cursor = 0
        self.laps = 0

    async def arm(self) -> FloatArray:
        """Load the trajectory (one file read or one network request), without blocking the loop.

        Raises:
            EdgeStartError: unreadable source, unknown name, or joints that do not match the robot.
        """
        if self.source.startswith("server:"):
            names, fps, frames = await self._fetch(self.source.removeprefix("server:"))
        else:
            try:
                recording = await anyio.to_thread.run_sync(read_recording, self.source)
            except (OSError, WireError) as exc:
                raise EdgeStartError(f"cannot replay {self.source!r}: {exc}", refused=False) from None
            names, fps, frames = (
                recording.header.joint_names,
                recording.header.fps,
                recording.actions(),
            )
        if list(names) != list(self.spec.joint_names):
            raise EdgeStartError(
                f"trajectory joints {list(names)} do not match the robot's {list(self.spec.joint_names)}",
                refused=True,
            )
        if len(frames) == 0:
            raise EdgeStartError(f"trajectory {self.source!r} has no frames", refused=True)
        self.trajectory = resample(frames, fps, self.spec.fps)
        log.info(
            "trajectory armed",
            source=self.source,
            frames=len(self.trajectory),
            network_requests=self.network_requests,
        )
        return self.trajectory

    async def _fetch(self, name: str) -> tuple[list[str], float, FloatArray]:
        cfg = self.config
        try:
            async with open_zsession(cfg.zenoh_settings()) as zsession:
                # Only the trusted server's signed answer is believed (servo.client.trajectory);
                # the identity is never used (nothing is opened): an ephemeral one reads no file.
                security = cfg.security
                client = self.client = PolicyClient(
                    zsession,
                    self.client_id,
                    trusted=security.trusted(),
                    known=security.known(),
                    identity=Identity.generate(),
                )
                servers = await client.discover(app=cfg.server.app or None, model=cfg.server.model or None)
                self.network_requests += 1
                trajectory = await client.fetch_trajectory(servers[0], name)
        except UntrustedServer as exc:
            raise EdgeStartError(f"cannot fetch trajectory {name!r}: {exc}", refused=True) from None
        except Exception as exc:
            raise EdgeStartError(f"cannot fetch trajectory {name!r}: {exc}", refused=False) from None
        what = f"trajectory {name!r}"
        try:
            check_rate(trajectory.fps, f"{what}: fps")
            shape = (None, len(trajectory.joint_names))
            frames = np.array(decode_floats(trajectory.positions, shape=shape, what=f"{what}: positions"))
            if not np.isfinite(frames).all():
                raise WireError(f"{what}: positions contain NaN or inf")
        except WireError as exc:
            raise EdgeStartError(f"cannot replay: {exc}", refused=True) from None
        return trajectory.joint_names, trajectory.fps, frames

    def stop(self) -> None:
        """Stop draining: what is queued is dropped, the robot holds."""
        self.pause()
        self.pipeline.queue.clear()

    async def start(self) -> None:
        """Arm (unless `arm` already ran)."""
        if self.trajectory is None:
            await self.arm()
        await super().start()

    async def produce(self, request: Request, *, episode_start: bool) -> Produced:
        """The next `REFILL_FRAMES` frames of the plan (the first request plans from the arm's pose)."""
        trajectory = self.trajectory
        assert trajectory is not None, "start() first"
        if self._plan is None:
            self._plan = np.concatenate([bridge(request.obs.state, trajectory[0], self.spec), trajectory])
        elif self._cursor >= len(self._plan):  # looping: back to the start through a bridge
            self.laps += 1
            self._plan = np.concatenate([bridge(trajectory[-1], trajectory[0], self.spec), trajectory])
            self._cursor = 0
        piece = self._plan[self._cursor : self._cursor + REFILL_FRAMES]
        self._cursor += len(piece)
        if self._cursor >= len(self._plan) and not self.loop:
            self.all_queued = True
            log.info("replay fully queued", frames=len(self._plan), laps=self.laps)
        self.requests += 1
        return Produced(piece, piece, LOCAL_SESSION, self.requests, 0.0)

    def merge(self, request: Request, produced: Produced, now_ns: int) -> int:
        """Queue the frames as they are (steps trimmed: 0).

        Pre-recorded frames answer no observation: nothing is trimmed and no staleness bound
        applies (they carry no provenance).
        """
        self.pipeline.queue.merge(produced.chunk_model, produced.chunk_robot, 0)
        self.chunks_received += 1
        self.failsafe.merged()
        return 0
