"""The one notice a replica sends without a session key: ``unknown_session``.

An observation naming a session this replica does not know (it restarted, or collected the
session) cannot be answered under the session key: the replica holds none. So the notice is
signed by the replica's identity instead (`servo.wire.trust.notice_transcript`, bound to the
replica, the client it goes to and the header of the observation it answers) and the edge re-handshakes only when
the signature verifies under the identity it trusts for that replica: a forged notice costs it
nothing. Signing is bounded twice, since anybody can send observations naming unknown sessions:
one notice per client id per second (`NOTICE_INTERVAL_S`) and `NOTICES_PER_S` for everybody.
"""

from __future__ import annotations

import contextlib

import zenoh

from servo._core import MSG_ERROR, Header, unauthenticated
from servo.identity import Identity
from servo.logs import LogThrottle
from servo.server.admission import TokenBucket
from servo.server.metrics import ServerMetrics
from servo.wire import ErrorEvent, ServerKeys, encode, notice_transcript, reply_header

#: At most one unknown_session notice per client id per this many seconds.
NOTICE_INTERVAL_S = 1.0
#: Notices signed per second for everybody together (an Ed25519 signature costs ~20 µs).
NOTICES_PER_S = 200.0


class KeylessNotices:
    """Signs and sends ``unknown_session`` notices. Called from Zenoh's observation thread.

    Args:
        zsession: The replica's Zenoh session.
        keys: The replica's keys (the notice goes to the client's action key).
        identity: The replica's identity, which signs each notice.
        metrics: Counts the notices sent (``servo_unknown_session_notices``).
    """

    def __init__(self, zsession: zenoh.Session, keys: ServerKeys, identity: Identity, metrics: ServerMetrics) -> None:
        self._zsession, self._keys, self._identity, self._metrics = zsession, keys, identity, metrics
        self._per_client = LogThrottle(NOTICE_INTERVAL_S, max_keys=4096)
        self._everybody = TokenBucket(NOTICES_PER_S, int(NOTICES_PER_S))

    def unknown_session(self, client_id: str, header: Header) -> None:
        """Tell ``client_id`` that the session its observation ``header`` names is unknown here."""
        if self._per_client.allow(client_id) is None or not self._everybody.take():
            return
        attachment = unauthenticated(reply_header(header, MSG_ERROR))
        code, message = "unknown_session", f"no session {header.session_id.hex()} here; open a new one"
        action_key = self._keys.client(client_id).action
        signature = self._identity.sign(notice_transcript(action_key, attachment, code, message))
        self._metrics.unknown_session_notices.inc()
        with contextlib.suppress(zenoh.ZError):
            self._zsession.put(
                action_key,
                encode(ErrorEvent(code, message, signature)),
                attachment=attachment,
                congestion_control=zenoh.CongestionControl.DROP,
            )
