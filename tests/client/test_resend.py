"""A chunk lost on the way back is asked for again, not waited for until the request times out.

A real in-process server over Zenoh on 127.0.0.1; the loss is the server's chunk put doing
nothing for one chosen seq_id, as a DROP publisher does when its transmit queue stays full. The
rule for when (`servo.client.resend`) is tested as the pure function it is.
"""

from __future__ import annotations

import numpy as np
import pytest

from servo.client import PolicyClient, RequestTimeout
from servo.client.resend import RESEND_MIN_S, RESEND_ROUND_TRIPS, ResendRule
from tests.support import client_settings, lose_chunks, make_manifest, running_server

pytestmark = pytest.mark.anyio

FRAMES = {"front": np.zeros((48, 64, 3), np.uint8)}
#: Far beyond any resend: a request answered only at its timeout fails the test.
TIMEOUT_S = 30.0


async def test_a_lost_chunk_is_asked_for_again_and_the_copy_answers(port: int, monkeypatch: pytest.MonkeyPatch) -> None:
    dropped = lose_chunks(monkeypatch, lambda seq: seq == 2)
    async with (
        running_server(make_manifest(port)) as (server, ready),
        PolicyClient.connect(client_settings(port), "arm-1") as client,
        client.session(features=ready.info.features, fps=30) as session,
    ):
        first = await session.infer(np.zeros(6, np.float32), FRAMES, timeout=TIMEOUT_S)
        assert session.resend_after(first.rtt_ns) == RESEND_MIN_S
        # Longer than the rule's, so that even at load the original is served (and lost) first.
        resend_after = 1.0
        second = await session.infer(np.ones(6, np.float32), FRAMES, timeout=TIMEOUT_S, resend_after=resend_after)
        assert dropped == [2]
        assert (first.seq_id, second.seq_id) == (1, 3)
        # The copy carries the original's stamp: the round trip counts the time lost.
        assert second.rtt_ns >= resend_after * 1e9
        assert (session.stats.resent, session.stats.sent) == (1, 3)
        (opened,) = server.registry.snapshot()
        assert opened.session_id == session.session_id


async def test_a_copy_whose_answer_is_lost_too_ends_at_the_timeout(port: int, monkeypatch: pytest.MonkeyPatch) -> None:
    dropped = lose_chunks(monkeypatch, lambda seq: True)
    async with (
        running_server(make_manifest(port)) as (_, ready),
        PolicyClient.connect(client_settings(port), "arm-3") as client,
        client.session(features=ready.info.features, fps=30) as session,
    ):
        with pytest.raises(RequestTimeout, match="seq 2"):
            await session.infer(np.zeros(6, np.float32), FRAMES, timeout=3.0, resend_after=0.2)
        # Sent once more, not again and again: one copy per request.
        assert session.stats.resent == 1
        assert set(dropped) <= {1, 2}


def test_before_its_first_answer_a_session_allows_the_replicas_whole_queue() -> None:
    assert ResendRule().copy_after(None) is None  # a fresh replica, no round trip yet: never
    assert ResendRule().copy_after(10_000_000) == RESEND_MIN_S
    assert ResendRule(forward_ms=700.0).copy_after(None) == pytest.approx(RESEND_ROUND_TRIPS * 0.7)
    assert ResendRule(forward_ms=16.0).copy_after(400_000_000) == pytest.approx(RESEND_ROUND_TRIPS * 0.4)
    # Right after a failover: 100 sessions of 16 ms forwards may each be served first, and the
    # round trips measured on the replica that died say nothing about that queue.
    assert ResendRule(forward_ms=16.0, sessions=100).copy_after(50_000_000) == pytest.approx(RESEND_MIN_S + 1.6)


def test_after_an_answer_the_servers_own_account_of_it_counts() -> None:
    rule = ResendRule(forward_ms=16.0, sessions=100)
    rule.answered(queue_wait_ms=30.0, inference_ms=16.0)
    assert rule.copy_after(50_000_000) == RESEND_MIN_S  # the queue drained: only round trips count
    # The server reports a queue that grew (its own requests wait 600 ms): slow, not lossy.
    rule.answered(queue_wait_ms=600.0, inference_ms=16.0)
    assert rule.copy_after(200_000_000) == pytest.approx(RESEND_ROUND_TRIPS * 0.616)
    assert rule.copy_after(900_000_000) == pytest.approx(RESEND_ROUND_TRIPS * 0.9)
