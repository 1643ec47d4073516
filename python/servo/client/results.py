"""What a session hands back: the chunks it received and its counters."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from servo._core import LatencyTracker

FloatArray = npt.NDArray[np.float32]

#: Encode times kept for `SessionStats.encode` (a fixed window, whatever the uptime).
ENCODE_WINDOW = 1000


@dataclass(frozen=True)
class ChunkResult:
    """A chunk with its timings. ``obs_mono_ns`` is the client's own stamp, echoed back."""

    seq_id: int
    episode_id: int
    chunk_model: FloatArray
    chunk_robot: FloatArray
    obs_mono_ns: int
    rtt_ns: int
    queue_wait_ms: float
    inference_ms: float
    superseded: int
    server_load: float


@dataclass
class SessionStats:
    """Counters of one session (written and read on the event loop).

    ``encode`` holds the encode times (ns) of the last `ENCODE_WINDOW` requests, ``last_encode_ms``
    the latest one: memory stays fixed however long the session runs. ``send_failed`` counts
    observations that never left (`SendFailed`), ``resent`` requests sent again because their
    answer was overdue (`RemoteSession.resend`; also counted in ``sent``), ``copy_answers`` the
    second answers of such requests (expected: neither merged nor refused).
    """

    sent: int = 0
    resent: int = 0
    copy_answers: int = 0
    send_failed: int = 0
    chunks: int = 0
    dropped_stale: int = 0
    errors: int = 0
    undecodable: int = 0
    last_encode_ms: float = 0.0
    encode: LatencyTracker = field(default_factory=lambda: LatencyTracker(ENCODE_WINDOW))
