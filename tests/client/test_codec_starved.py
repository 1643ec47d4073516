"""`auto` on a link too slow for every usual quality: the floor qualities carry frames, and only then.

A congestion window collapsed by loss and delay carries ~10 kB/s (docs/guides/bad-links.md): two
480x640 frames at the usual qualities (58-195 kB) then take longer than the request timeout, so
every request times out and is recorded at what it cost to get nothing.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from servo.client.codec import RAW, AutoCodec, CodecChooser
from tests.client.test_codec import SIZES, FakeLink

#: Two frames at the floor qualities (camera-like content).
FLOOR_SIZES = {40: 42_000, 10: 22_000}
ALL_SIZES = {**SIZES, **FLOOR_SIZES}
#: What a timed-out request records (the edge's request timeout).
TIMEOUT_MS = 5000.0


@dataclass
class CappedLink(FakeLink):
    """A FakeLink whose requests time out: none is recorded as costing more than the timeout."""

    def net_ms_of(self, quality: int) -> float:
        decode = 0.0 if quality == RAW else self.decode_ms
        return min(TIMEOUT_MS, self.base_ms + ALL_SIZES[quality] * 8 / (self.mbit_s * 1e3) + decode)

    def step(self, chooser: CodecChooser) -> int:
        quality = chooser.next()
        net = self.net_ms_of(quality)
        chooser.record(quality, encode_ms=self.encode_ms_of(quality), net_ms=net, nbytes=ALL_SIZES[quality])
        return quality


def collapsed() -> CappedLink:
    """~10 kB/s and a 350 ms round trip: 20 % loss and 50-200 ms of jitter each way."""
    return CappedLink(mbit_s=0.08, base_ms=350.0)


def test_a_collapsed_link_gets_the_floor_within_a_few_requests() -> None:
    chooser, link = CodecChooser("auto"), collapsed()
    used = [link.step(chooser) for _ in range(40)]
    first_floor = next(i for i, q in enumerate(used) if q in FLOOR_SIZES)
    assert first_floor <= 3, used  # raw (cold) and one JPEG probe timed out: that is enough
    # 10 costs 350 + 2,200 ms, 40 (4,550 ms) is over the 1 s a starving request may cost: 10 stays.
    assert chooser.current == 10
    assert Counter(used)[10] >= 30, used


def test_a_higher_floor_quality_is_used_once_it_is_measured_in_time() -> None:
    chooser, link = CodecChooser("auto"), CappedLink(mbit_s=0.8, base_ms=350.0)  # ~100 kB/s
    # 95/90/80 cost 2.3/1.4/0.93 s: 80 is under starved_ms, so nothing starves and no floor is used.
    assert 40 not in link.run(chooser, 100)
    assert chooser.current == 80
    chooser, link = CodecChooser("auto"), CappedLink(mbit_s=0.6, base_ms=350.0)  # 80 at 1.13 s, 40 at 0.91 s
    link.run(chooser, 100)
    assert chooser.current == 40


def test_the_floor_is_never_used_on_a_link_that_carries_the_usual_qualities() -> None:
    for mbit_s in (100.0, 16_000.0, 1.0):
        chooser = CodecChooser("auto")
        counts = CappedLink(mbit_s=mbit_s).run(chooser, 300)
        assert not set(counts) & set(FLOOR_SIZES), (mbit_s, counts)


def test_a_recovered_link_leaves_the_floor_at_the_next_reprobe() -> None:
    chooser = CodecChooser("auto")
    collapsed().run(chooser, 20)
    assert chooser.current in FLOOR_SIZES
    healthy = CappedLink(mbit_s=100.0)
    used = [healthy.step(chooser) for _ in range(2 * AutoCodec().reprobe_every)]
    back = next(i for i, q in enumerate(used) if q not in FLOOR_SIZES and chooser.current not in FLOOR_SIZES)
    assert back <= AutoCodec().reprobe_every + 1, used
    assert chooser.current not in FLOOR_SIZES


def test_no_floor_for_a_fixed_quality_or_an_empty_floor() -> None:
    assert set(collapsed().run(CodecChooser(80), 20)) == {80}
    chooser = CodecChooser("auto", AutoCodec(floor=[]))
    assert not set(collapsed().run(chooser, 40)) & set(FLOOR_SIZES)
