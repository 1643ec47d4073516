"""Records every control tick to an episode file, in the edge's main process (never on the control loop).

The control loop hands each tick over through shared memory (`servo.edge.channel.ControlChannel`);
the runtime drains those entries into `Recorder.record`, and a writer thread encodes and writes.
"""

from __future__ import annotations

import collections
import threading
import time
from pathlib import Path

from servo.edge.channel import Tick
from servo.edge.failsafe import FailSafe
from servo.logs import get_logger
from servo.recording import EpisodeHeader, FrameRecord, RecordingWriter
from servo.robots.protocol import RobotSpec
from servo.wire import encode_image, encode_tensor

log = get_logger(__name__)


#: Ticks buffered before the recorder starts dropping (10 s at 30 Hz): the loop never waits.
MAX_BACKLOG = 300


class Recorder:
    """The runtime appends (a deque append, never blocking); a writer thread encodes and writes.

    Args:
        path: Recording file to create.
        spec: The robot (names, fps, cameras).
        image_every: Record camera frames every N ticks as JPEG (0 = no images).
        failsafe: The engine's state machine: each frame carries the transitions made since the
            previous one (with their own time), so a recording holds the edge's whole story.
    """

    def __init__(
        self,
        path: str | Path,
        spec: RobotSpec,
        *,
        episode_id: int = 0,
        client_id: str = "",
        task: str = "",
        image_every: int = 0,
        jpeg_quality: int = 90,
        failsafe: FailSafe | None = None,
    ) -> None:
        self.path = Path(path)
        self._failsafe = failsafe
        self._seen_transitions = 0
        self._header = EpisodeHeader(
            robot=spec.name,
            fps=spec.fps,
            joint_names=list(spec.joint_names),
            episode_id=episode_id,
            client_id=client_id,
            task=task,
            cameras={name: [cam.height, cam.width] for name, cam in spec.cameras.items()},
            # The edge's own clock pair: what lets `servo-trace` find "14:03" in a recording.
            start_wall_ns=time.time_ns(),
            start_mono_ns=time.monotonic_ns(),
        )
        self._image_every = image_every
        self._jpeg_quality = jpeg_quality
        self._items: collections.deque[tuple[Tick, list[tuple[int, str, str]]]] = collections.deque()
        self._ready = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="servo-recorder", daemon=True)
        self.dropped = 0
        self.written = 0

    def start(self) -> None:
        """Create the file and start the writer thread."""
        self._writer = RecordingWriter(self.path, self._header)
        self._thread.start()

    def wants_images(self, tick: int) -> bool:
        """Whether tick number ``tick`` should carry camera frames."""
        return bool(self._image_every) and tick % self._image_every == 0

    def record(self, tick: Tick) -> None:
        """Queue one tick (never blocks; drops when the writer is far behind).

        Called on the event loop, which also drives the fail-safe's transitions.
        """
        if len(self._items) >= MAX_BACKLOG:
            self.dropped += 1
            return
        if not self.wants_images(tick.tick):
            tick.images = None
        transitions = []
        if self._failsafe is not None:
            new = self._failsafe.transitions_since(self._seen_transitions)
            self._seen_transitions = self._failsafe.transition_count
            transitions = [(t.mono_ns, t.state.value, t.reason) for t in new]
        self._items.append((tick, transitions))
        self._ready.set()

    def close(self) -> None:
        """Write what is queued, then close the file."""
        self._stop.set()
        self._ready.set()
        if self._thread.is_alive():
            self._thread.join()
        self._writer.close()

    def _run(self) -> None:
        while True:
            self._ready.wait()
            self._ready.clear()
            while self._items:
                self._write(*self._items.popleft())
            if self._stop.is_set() and not self._items:
                return

    def _write(self, tick: Tick, transitions: list[tuple[int, str, str]]) -> None:
        prov = tick.provenance
        images = tick.images or {}
        self._writer.write(
            FrameRecord(
                tick=tick.tick,
                mono_ns=tick.mono_ns,
                state=encode_tensor(tick.state),
                action=None if tick.action is None else encode_tensor(tick.action),
                source=tick.source,
                provenance=None if prov is None else (prov.session_id, prov.seq_id, prov.episode_id, prov.obs_mono_ns),
                step=None if prov is None else prov.step,
                images={name: encode_image(frame, self._jpeg_quality) for name, frame in images.items()},
                transitions=transitions,
            )
        )
        self.written += 1
