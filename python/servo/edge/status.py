"""The edge's live status line (``servo-edge`` in a terminal): state, round trip, queue, jitter, codec."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

import anyio
import numpy as np

from servo.client.codec import CodecStatus
from servo.edge.channel import lateness_percentiles_ms
from servo.edge.control_loop import ControlLoop
from servo.edge.engine import EngineBase
from servo.edge.failsafe import EngineState

#: Status-line refresh, and how many refreshes its "recent" jitter covers (5 s).
STATUS_S = 0.25
STATUS_WINDOW = 20


async def show_status(engine: EngineBase, loop: ControlLoop, show: Callable[[str], None]) -> None:
    """Refresh the line every `STATUS_S` until the engine is DEAD (a task of the runtime's event loop)."""
    channel = loop.channel
    history: deque[np.ndarray] = deque(maxlen=STATUS_WINDOW)
    while True:
        stats = engine.statistics()
        ticks = loop.statistics().ticks
        counts = channel.lateness_counts()
        history.append(counts)
        recent = lateness_percentiles_ms(counts - history[0], [0.99], 1 << 62)
        p99 = "-" if recent is None else f"{recent[0]:.2f}"
        rtt = f"{stats.rtt_ms_p50:.1f}" if stats.rtt_ms_p50 is not None else "-"
        show(
            f"[{stats.state.upper()}] rtt {rtt} ms | delay {stats.delay_steps} | queue {stats.queue_depth} | "
            f"fallback {stats.fallback_ticks} | jitter p99 {p99} ms | ticks {ticks}{_codec_text(stats.codec)}"
            + (f" | {stats.starving} (see log)" if stats.starving else "")
        )
        if engine.state is EngineState.DEAD:
            return
        await anyio.sleep(STATUS_S)


def _codec_text(codec: CodecStatus | None) -> str:
    """`` | codec jpeg90 (auto, link 97 Mbit/s)``, or nothing for a local engine."""
    if codec is None:
        return ""
    if not codec.auto:
        return f" | codec {codec.current}"
    link = "-" if codec.link_mbps is None else f"{codec.link_mbps:.0f}"
    return f" | codec {codec.current} (auto, link {link} Mbit/s)"
