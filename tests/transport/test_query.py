"""transport.query over real Zenoh sessions: a query whose end never comes from Zenoh."""

from __future__ import annotations

from collections.abc import Iterator

import anyio
import pytest
import zenoh

from servo.transport import ZenohSettings, bridge, query

pytestmark = pytest.mark.anyio

KEY = "servo/test/echo"


@pytest.fixture
def responder(port: int) -> Iterator[zenoh.Session]:
    """A peer that answers every query on `KEY` at once but keeps it open (no final yet)."""
    held: list[zenoh.Query] = []

    def answer(q: zenoh.Query) -> None:
        q.reply(KEY, b"here")
        held.append(q)  # the final reply leaves when the query is dropped: only at close

    session = zenoh.open(ZenohSettings(mode="peer", listen=[f"tcp/127.0.0.1:{port}"]).to_config())
    session.declare_queryable(KEY, answer)
    try:
        yield session
    finally:
        held.clear()
        session.close()


async def test_a_late_drop_ends_the_query_with_its_replies_not_a_timeout(
    port: int, responder: zenoh.Session, monkeypatch: pytest.MonkeyPatch
) -> None:
    # At load 16 a robot process's Zenoh callback thread came seconds late with the query's
    # drop: the guard raised the builtin TimeoutError, which no connect_best caller catches
    # (it killed the process), and the replies already in were lost.
    zsession = zenoh.open(ZenohSettings(mode="client", connect=[f"tcp/127.0.0.1:{port}"]).to_config())
    try:
        with anyio.fail_after(30):
            while not await query(zsession, KEY, timeout=0.5):  # until the route is known
                pass
            # The guard now expires long before Zenoh's own timeout would end the query.
            monkeypatch.setattr(bridge, "DROP_GRACE_S", -9.5)
            replies = await query(zsession, KEY, timeout=10.0)
        assert [r.ok.payload.to_bytes() for r in replies if r.ok is not None] == [b"here"]
    finally:
        zsession.close()
