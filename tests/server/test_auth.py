"""The server side of the session layer on its own: handshake, verifiers, takeover rule."""

from __future__ import annotations

import time

import pytest
import zenoh

from servo._core import (
    ATTACHMENT_SIZE,
    MSG_CHUNK,
    MSG_CONTROL,
    MSG_OBS,
    SCHEMA_VERSION,
    Header,
    KeyPair,
    ServerIdentity,
    SessionKey,
    unauthenticated,
    verify_signature,
)
from servo.server.auth import (
    Refused,
    SessionAuth,
    accept_handshake,
    takeover,
    verify_control,
    verify_observation,
)
from servo.wire import CameraFeature, Features, SessionOpen, ack_transcript, resume_body
from tests.server.test_control import Uncopyable

FEATURES = Features(["a"], ["a"], {"front": CameraFeature(8, 8)})


ROBOT = ServerIdentity.generate().public_key


def opening(pair: KeyPair, *, resume: bytes = b"", epoch: int = 3, robot: bytes = ROBOT) -> SessionOpen:
    return SessionOpen(
        "robot", [SCHEMA_VERSION], FEATURES, 30.0, pair.public_key, session_epoch=epoch, resume=resume, robot_key=robot
    )


def handshake() -> tuple[SessionAuth, SessionKey]:
    """A server-side auth state and the key its client derived."""
    pair = KeyPair()
    done = accept_handshake(opening(pair), ServerIdentity.generate(), "r1")
    client_key = pair.session_key(
        done.server_key, client_public=pair.public_key, server_public=done.server_key, session_id=done.auth.wire_id
    )
    return done.auth, client_key


def obs(auth: SessionAuth, seq: int, **changes: int | bytes) -> Header:
    header = Header(SCHEMA_VERSION, MSG_OBS, 0, seq, 0, auth.epoch, 7, auth.wire_id)
    return header.replace(**changes) if changes else header


def test_both_ends_derive_the_same_key_and_the_ack_signature_binds_the_transcript() -> None:
    pair = KeyPair()
    identity = ServerIdentity.generate()
    request = opening(pair)
    done = accept_handshake(request, identity, "r1")
    assert len(done.auth.wire_id) == 16
    assert done.auth.epoch == 3
    key = pair.session_key(
        done.server_key, client_public=pair.public_key, server_public=done.server_key, session_id=done.auth.wire_id
    )
    chunk = obs(done.auth, 1, msg_type=MSG_CHUNK)
    assert key.decrypt(*done.auth.key.encrypt(chunk, b"chunk")) == (chunk, b"chunk")
    assert done.auth.key.decrypt(*key.encrypt(obs(done.auth, 1), b"obs")) == (obs(done.auth, 1), b"obs")
    transcript = ack_transcript(pair.public_key, done.server_key, done.auth.wire_id, "r1")
    assert verify_signature(identity.public_key, transcript, done.signature)
    # Any other replica, session or key in the transcript, and the signature no longer holds.
    assert not verify_signature(identity.public_key, transcript.replace(b"r1", b"r2"), done.signature)
    other = ack_transcript(KeyPair().public_key, done.server_key, done.auth.wire_id, "r1")
    assert not verify_signature(identity.public_key, other, done.signature)


def test_session_ids_are_random_and_never_repeat() -> None:
    ids = {accept_handshake(opening(KeyPair()), ServerIdentity.generate(), "r").auth.wire_id for _ in range(200)}
    assert len(ids) == 200


def test_a_low_order_client_key_is_refused() -> None:
    request = SessionOpen("robot", [SCHEMA_VERSION], FEATURES, 30.0, bytes(32))
    with pytest.raises(Refused) as info:
        accept_handshake(request, ServerIdentity.generate(), "r1")
    assert info.value.reason == "header"


def test_an_observation_passes_every_check_once() -> None:
    auth, key = handshake()
    attachment, ciphertext = key.encrypt(obs(auth, 1), b"observation")
    assert b"observation" not in ciphertext
    header, plaintext = verify_observation(auth, attachment, ciphertext, max_bytes=1024)
    assert (header.seq_id, plaintext) == (1, b"observation")
    assert auth.last_obs_seq == 1


@pytest.mark.parametrize("tamper", [False, True], ids=["as-sent", "a-byte-changed"])
def test_an_observation_in_zenoh_shared_memory_is_opened_and_a_changed_one_refused(tamper: bool) -> None:
    auth, key = handshake()
    attachment, ciphertext = key.encrypt(obs(auth, 1), b"observation" * 1000)
    provider = zenoh.shm.ShmProvider.default_backend(1 << 20)
    sent = bytearray(ciphertext)
    sent[7] ^= tamper
    shared = provider.alloc(len(sent), zenoh.shm.BlockOn(zenoh.shm.GarbageCollect()))
    shared[0 : len(sent)] = sent
    payload = zenoh.ZBytes(shared)
    assert payload.as_shm() is not None  # as a sample from a same-host sender arrives
    auth.key = opened = Opened(auth.key)
    if tamper:
        with pytest.raises(Refused) as info:
            verify_observation(auth, attachment, payload, max_bytes=1 << 20)
        assert info.value.reason == "mac"
    else:
        assert verify_observation(auth, attachment, payload, max_bytes=1 << 20)[1] == b"observation" * 1000
    assert opened.given == [zenoh.shm.ZShm]  # read out of the shared memory, not through Zenoh's copy


class Opened:
    """A session key that records what it was given to decrypt."""

    def __init__(self, key: SessionKey) -> None:
        self._key = key
        self.given: list[type] = []

    def decrypt(self, attachment: bytes, ciphertext: object) -> tuple[Header, bytes]:
        self.given.append(type(ciphertext))
        return self._key.decrypt(attachment, ciphertext)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("name", "reason"),
    [
        ("no attachment", "header"),
        ("garbage attachment", "header"),
        ("a chunk, not an observation", "header"),
        ("no session for the client", "session"),
        ("another session id", "session"),
        ("too large", "too_large"),
        ("keyless", "mac"),
        ("guessed key", "mac"),
        ("body changed", "mac"),
        ("another epoch", "epoch"),
        ("replayed seq", "replay"),
        ("older seq", "replay"),
    ],
)
def test_every_failed_check_is_refused_with_its_reason(name: str, reason: str) -> None:
    auth, key = handshake()
    body = b"observation"
    key_of_session: SessionAuth | None = auth
    older = key.encrypt(obs(auth, 4), body)  # captured, delivered late
    fifth = key.encrypt(obs(auth, 5), body)
    verify_observation(auth, *fifth, max_bytes=1024)  # seq 5 accepted
    attachment: bytes | None
    if name == "no attachment":
        attachment, payload = None, key.encrypt(obs(auth, 6), body)[1]
    elif name == "garbage attachment":
        attachment, payload = b"SV" + bytes(60), body
    elif name == "a chunk, not an observation":
        attachment, payload = auth.key.encrypt(obs(auth, 6, msg_type=MSG_CHUNK), body)
    elif name == "no session for the client":
        (attachment, payload), key_of_session = key.encrypt(obs(auth, 6), body), None
    elif name == "another session id":
        attachment, payload = key.encrypt(obs(auth, 6, session_id=bytes(16)), body)
    elif name == "too large":
        attachment, payload = key.encrypt(obs(auth, 6), b"x" * 2000)
    elif name == "keyless":
        attachment, payload = unauthenticated(obs(auth, 6)), body
    elif name == "guessed key":
        attachment, payload = SessionKey(bytes(32), role="client").encrypt(obs(auth, 6), body)
    elif name == "body changed":
        attachment, payload = key.encrypt(obs(auth, 6), body)
        payload = bytes([payload[0] ^ 1]) + payload[1:]
    elif name == "another epoch":
        attachment, payload = key.encrypt(obs(auth, 6, session_epoch=auth.epoch + 1), body)
    elif name == "replayed seq":
        attachment, payload = fifth
    else:
        attachment, payload = older
    with pytest.raises(Refused) as info:
        verify_observation(key_of_session, attachment, payload, max_bytes=1024)
    assert info.value.reason == reason
    assert auth.last_obs_seq == 5  # nothing refused moves the replay window


def test_control_requests_have_their_own_seq_stream() -> None:
    """A reset travels beside the observation in flight and may overtake it: separate windows."""
    auth, key = handshake()
    verify_observation(auth, *key.encrypt(obs(auth, 10), b"o"), max_bytes=64)
    control = obs(auth, 1, msg_type=MSG_CONTROL)
    reset = key.encrypt(control, b"reset")
    assert verify_control(auth, *reset, max_bytes=64) == (control, b"reset")
    with pytest.raises(Refused, match="not above"):
        verify_control(auth, *reset, max_bytes=64)
    eleventh = key.encrypt(obs(auth, 11), b"o")
    with pytest.raises(Refused) as info:  # an observation's attachment is no control request
        verify_control(auth, *eleventh, max_bytes=64)
    assert info.value.reason == "header"
    assert verify_observation(auth, *eleventh, max_bytes=64)[0].seq_id == 11


def test_an_oversized_control_request_is_refused_before_its_mac_and_takes_no_seq_id() -> None:
    auth, key = handshake()
    big = b"x" * 65
    attachment, ciphertext = key.encrypt(obs(auth, 1, msg_type=MSG_CONTROL), big)
    with pytest.raises(Refused) as info:
        verify_control(auth, attachment, ciphertext, max_bytes=64)
    assert info.value.reason == "too_large"
    assert auth.last_control_seq == 0
    # Bounded before the MAC: a forged oversized body is refused for its size, not its key.
    with pytest.raises(Refused) as info:
        verify_control(auth, unauthenticated(obs(auth, 1, msg_type=MSG_CONTROL)), big, max_bytes=64)
    assert info.value.reason == "too_large"
    # Bounded before the copy: a body still in Zenoh is measured, never copied.
    with pytest.raises(Refused) as info:
        verify_control(auth, attachment, Uncopyable(), max_bytes=64)  # type: ignore[arg-type]
    assert info.value.reason == "too_large"


class HugeAttachment:
    """An attachment still in Zenoh, far larger than a servo attachment; copying it fails the test."""

    def __len__(self) -> int:
        return 1 << 30

    def to_bytes(self) -> bytes:
        raise AssertionError("an oversized attachment was copied out of Zenoh")


def test_an_attachment_of_the_wrong_size_is_refused_before_it_is_copied() -> None:
    auth, key = handshake()
    body = b"x" * 10
    for verify, msg_type in ((verify_observation, MSG_OBS), (verify_control, MSG_CONTROL)):
        with pytest.raises(Refused) as info:
            verify(auth, HugeAttachment(), body, max_bytes=64)  # type: ignore[operator]
        assert info.value.reason == "header"
        assert f"attachment is {1 << 30} bytes, expected {ATTACHMENT_SIZE}" in str(info.value)
        # The right size is still copied and verified as before.
        attachment, ciphertext = key.encrypt(obs(auth, 1, msg_type=msg_type), body)
        header, plaintext = verify(auth, zenoh.ZBytes(attachment), ciphertext, max_bytes=64)  # type: ignore[operator]
        assert (header.seq_id, header.msg_type, plaintext) == (1, msg_type, body)


def test_a_live_session_is_replaced_only_by_its_robot_proof_absence_or_silence() -> None:
    auth, key = handshake()
    newcomer = KeyPair()
    stranger = opening(newcomer, robot=ServerIdentity.generate().public_key)
    assert auth.robot_key == ROBOT
    assert takeover(auth, opening(newcomer), client_present=True, idle_s=30) == "same_robot"
    assert takeover(auth, stranger, client_present=True, idle_s=30) is None
    assert takeover(auth, stranger, client_present=False, idle_s=30) == "vanished"
    auth.last_observation_ns = time.monotonic_ns() - 31_000_000_000
    # Only an authenticated observation is activity: a control request keeps nothing alive.
    verify_control(auth, *key.encrypt(obs(auth, 1, msg_type=MSG_CONTROL), b"reset"), max_bytes=64)
    assert takeover(auth, stranger, client_present=True, idle_s=30) == "idle"
    verify_observation(auth, *key.encrypt(obs(auth, 1), b"o"), max_bytes=64)
    assert takeover(auth, stranger, client_present=True, idle_s=30) is None


def test_a_resume_proof_counts_once_for_the_handshake_it_names() -> None:
    auth, key = handshake()
    newcomer = KeyPair()
    proof = key.authenticate(obs(auth, 1, msg_type=MSG_CONTROL), resume_body(newcomer.public_key))
    # For another handshake's key the proof says nothing (a sniffed proof is worthless).
    other = ServerIdentity.generate().public_key  # the proof, not the robot identity, must decide
    assert takeover(auth, opening(KeyPair(), resume=proof, robot=other), client_present=True, idle_s=30) is None
    with_proof = opening(newcomer, resume=proof, robot=other)
    assert takeover(auth, with_proof, client_present=True, idle_s=30) == "resumed"
    assert takeover(auth, with_proof, client_present=True, idle_s=30) is None  # replayed: the seq is used
    forged = SessionKey(bytes(32), role="client").authenticate(
        obs(auth, 9, msg_type=MSG_CONTROL), resume_body(newcomer.public_key)
    )
    assert takeover(auth, opening(newcomer, resume=forged, robot=other), client_present=True, idle_s=30) is None
