"""Hostile peers that answer a robot's requests with keyless notices (see `tests.security.peers`).

* `NoticeForger`: answers every observation of a robot with a burst of forged keyless
  ``unknown_session`` notices (unsigned, or signed by the wrong identity).
* `NoticeOracle`: makes the replica itself sign ``unknown_session`` notices echoing a robot's
  requests (under client ids of its own) and forwards them to that robot.
"""

from __future__ import annotations

import zenoh
from zenoh.handlers import Callback

from servo._core import MSG_ERROR, ServerIdentity
from servo.wire import ErrorEvent, encode, notice_transcript
from tests.security.peers import Seen, echo


class NoticeForger:
    """Answers every observation on ``obs_selector`` at once with ``repeat`` forged keyless
    ``unknown_session`` notices echoing it: unsigned ones, and ones signed by an identity of
    the forger's own for the robot's action key (a valid signature, by the wrong key).

    What a sniffer on a flat network can do to make a robot drop its session (issue 18: ~20
    re-handshakes, then the robot's own open limit, 6.8 s without a fresh action).
    """

    def __init__(self, z: zenoh.Session, obs_selector: str, *, repeat: int = 4) -> None:
        self.forged = 0
        self._z, self._repeat = z, repeat
        self._identity = ServerIdentity.generate()
        self._sub = z.declare_subscriber(obs_selector, Callback(self._answer, indirect=False))

    def _answer(self, sample: zenoh.Sample) -> None:
        if sample.attachment is None:
            return
        seen = Seen(str(sample.key_expr), sample.attachment.to_bytes(), b"")
        if seen.header is None:
            return
        action_key = seen.key.rsplit("/", 1)[0] + "/action"
        attachment, _ = echo(seen, MSG_ERROR, b"")
        code, message = "unknown_session", "forged: open a new one"
        signature = self._identity.sign(notice_transcript(action_key, attachment, code, message))
        for i in range(self._repeat):
            body = encode(ErrorEvent(code, message, signature if i % 2 else b""))
            self._z.put(action_key, body, attachment=attachment)
            self.forged += 1

    def close(self) -> None:
        self._sub.undeclare()


class NoticeOracle:
    """Makes the replica sign ``unknown_session`` notices for a robot's requests, and forwards them.

    Every observation of ``victim`` (sniffed: its header is plain text) is re-published, header
    and all, under a client id of the oracle's own that holds no session, so the replica answers
    it with a genuine signed notice echoing the victim's header; that notice is put on the
    victim's action key at once, ahead of the real chunk.
    """

    def __init__(self, z: zenoh.Session, prefix: str, victim: str) -> None:
        self.asked = self.forwarded = 0
        self._z, self._prefix = z, prefix
        self._victim_action = f"{prefix}/c/{victim}/action"
        self._entities = [
            z.declare_subscriber(f"{prefix}/c/{victim}/obs", Callback(self._ask, indirect=False)),
            z.declare_subscriber(f"{prefix}/c/*/action", Callback(self._forward, indirect=False)),
        ]

    def _ask(self, sample: zenoh.Sample) -> None:
        if sample.attachment is None:
            return
        self.asked += 1  # a fresh client id each time: the replica signs one notice per id per second
        oracle = f"{self._prefix}/c/oracle-{self.asked}/obs"
        self._z.put(oracle, sample.payload.to_bytes(), attachment=sample.attachment.to_bytes())

    def _forward(self, sample: zenoh.Sample) -> None:
        if sample.attachment is None or "/c/oracle-" not in str(sample.key_expr):
            return
        self._z.put(self._victim_action, sample.payload.to_bytes(), attachment=sample.attachment.to_bytes())
        self.forwarded += 1

    def close(self) -> None:
        for entity in reversed(self._entities):
            entity.undeclare()
