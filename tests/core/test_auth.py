"""servo._core key exchange and identities: X25519 session keys, Ed25519 server identity.

The session cipher those keys drive is tested in tests/core/test_cipher.py.
"""

from __future__ import annotations

import re

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from hypothesis import given
from hypothesis import strategies as st

from servo._core import (
    KEY_SIZE,
    MSG_CHUNK,
    MSG_OBS,
    PUBLIC_KEY_SIZE,
    SCHEMA_VERSION,
    SEED_SIZE,
    SIGNATURE_SIZE,
    AuthError,
    Header,
    HeaderError,
    KeyPair,
    ServerIdentity,
    SessionKey,
    verify_signature,
)

SESSION = bytes(range(16))
HEADER = Header(SCHEMA_VERSION, MSG_OBS, 1, 42, 7, 3, 123_456_789, SESSION)
BODY = bytes(range(256)) * 4


def test_constants() -> None:
    assert (KEY_SIZE, PUBLIC_KEY_SIZE, SEED_SIZE, SIGNATURE_SIZE) == (32, 32, 32, 64)
    assert issubclass(AuthError, ValueError)
    assert not issubclass(AuthError, HeaderError)


# ------------------------------------------------------------------------------ key exchange


def exchange(session_id: bytes = SESSION) -> tuple[SessionKey, SessionKey]:
    client, server = KeyPair(), KeyPair()
    roles = {"client_public": client.public_key, "server_public": server.public_key, "session_id": session_id}
    return client.session_key(server.public_key, **roles), server.session_key(client.public_key, **roles)


def test_both_sides_derive_the_same_session() -> None:
    client_key, server_key = exchange()
    assert (client_key.role, server_key.role) == ("client", "server")
    assert server_key.decrypt(*client_key.encrypt(HEADER, BODY)) == (HEADER, BODY)
    chunk_header = HEADER.replace(msg_type=MSG_CHUNK)
    assert client_key.decrypt(*server_key.encrypt(chunk_header, b"chunk")) == (chunk_header, b"chunk")


def test_each_exchange_and_session_id_gives_another_key() -> None:
    client_key, _ = exchange(SESSION)
    _, other_server_key = exchange(SESSION)
    with pytest.raises(AuthError, match="tag mismatch"):
        other_server_key.decrypt(*client_key.encrypt(HEADER, BODY))
    # Same key pairs, another session id: another key.
    client, server = KeyPair(), KeyPair()
    a = client.session_key(
        server.public_key, client_public=client.public_key, server_public=server.public_key, session_id=SESSION
    )
    b = server.session_key(
        client.public_key, client_public=client.public_key, server_public=server.public_key, session_id=bytes(16)
    )
    with pytest.raises(AuthError, match="tag mismatch"):
        b.decrypt(*a.encrypt(HEADER, BODY))


def test_public_keys_are_fresh() -> None:
    keys = {KeyPair().public_key for _ in range(50)}
    assert len(keys) == 50
    assert all(len(k) == PUBLIC_KEY_SIZE for k in keys)


def test_a_key_pair_is_single_use() -> None:
    client, server = KeyPair(), KeyPair()
    roles = {"client_public": client.public_key, "server_public": server.public_key, "session_id": SESSION}
    client.session_key(server.public_key, **roles)
    with pytest.raises(AuthError, match="already used"):
        client.session_key(server.public_key, **roles)
    assert len(client.public_key) == PUBLIC_KEY_SIZE  # still readable


def test_roles_must_be_the_two_key_pairs() -> None:
    client, server, stranger = KeyPair(), KeyPair(), KeyPair()
    c, s = client.public_key, server.public_key
    with pytest.raises(AuthError, match=r"^client_public and server_public are the same key$"):
        client.session_key(s, client_public=c, server_public=c, session_id=SESSION)
    with pytest.raises(AuthError, match=r"^this key pair's public key is neither client_public nor server_public$"):
        client.session_key(s, client_public=stranger.public_key, server_public=s, session_id=SESSION)
    with pytest.raises(AuthError, match=r"^peer_public is not the other party's public key$"):
        client.session_key(stranger.public_key, client_public=c, server_public=s, session_id=SESSION)
    # Refused before the secret was used: the pair still works.
    client.session_key(s, client_public=c, server_public=s, session_id=SESSION)


# Points of order 1, 2, 4 and 8 on Curve25519 (u-coordinates), including non-canonical
# encodings: X25519 with any of them gives the all-zero shared secret.
LOW_ORDER = [
    "0000000000000000000000000000000000000000000000000000000000000000",
    "0100000000000000000000000000000000000000000000000000000000000000",
    "e0eb7a7c3b41b8ae1656e3faf19fc46ada098deb9c32b1fd866205165f49b800",
    "5f9c95bca3508c24b1d0b1559c83ef5b04445cc4581c8e86d8224eddd09f1157",
    "ecffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff7f",
    "edffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff7f",
    "eeffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff7f",
]


@pytest.mark.parametrize("point", LOW_ORDER)
def test_low_order_peer_keys_are_refused(point: str) -> None:
    server = KeyPair()
    peer = bytes.fromhex(point)
    with pytest.raises(AuthError, match=re.escape("peer public key is of low order (all-zero shared secret)")):
        server.session_key(peer, client_public=peer, server_public=server.public_key, session_id=SESSION)


@pytest.mark.parametrize(
    ("field", "size", "expected"),
    [
        ("peer_public", 31, 32),
        ("client_public", 33, 32),
        ("server_public", 0, 32),
        ("session_id", 15, 16),
        ("session_id", 32, 16),
    ],
)
def test_exchange_lengths_are_checked(field: str, size: int, expected: int) -> None:
    client, server = KeyPair(), KeyPair()
    args = {
        "peer_public": server.public_key,
        "client_public": client.public_key,
        "server_public": server.public_key,
        "session_id": SESSION,
    }
    args[field] = bytes(size)
    peer = args.pop("peer_public")
    with pytest.raises(AuthError, match=rf"^{field} is {size} bytes, expected {expected}$"):
        client.session_key(peer, **args)


def test_key_pair_repr_shows_only_the_public_key() -> None:
    pair = KeyPair()
    assert repr(pair) == f"KeyPair(public_key=bytes.fromhex('{pair.public_key.hex()}'))"


# ------------------------------------------------------------------------------ server identity

# RFC 8032 section 7.1, TEST 1 and TEST 2.
RFC8032 = [
    (
        "9d61b19deffd5a60ba844af492ec2cc44449c5697b326919703bac031cae7f60",
        "d75a980182b10ab7d54bfed3c964073a0ee172f3daa62325af021a68f707511a",
        b"",
        "e5564300c360ac729086e2cc806e828a84877f1eb8e5d974d873e06522490155"
        "5fb8821590a33bacc61e39701cf9b46bd25bf5f0595bbe24655141438e7a100b",
    ),
    (
        "4ccd089b28ff96da9db6c346ec114e0f5b8a319f35aba624da8cf6ed4fb8a6fb",
        "3d4017c3e843895a92b70aa74d1b7ebc9c982ccf2ec4968cc0cd55f12af4660c",
        b"\x72",
        "92a009a9f0d4cab8720e820b5f642540a2b27b5416503f8fb3762223ebdb69da"
        "085ac1e43e15996e458f3613d0f11d8c387b2eaeb4302aeeb00d291612bb0c00",
    ),
]


@pytest.mark.parametrize(("seed", "public", "message", "signature"), RFC8032)
def test_rfc8032_vectors(seed: str, public: str, message: bytes, signature: str) -> None:
    identity = ServerIdentity.from_seed(bytes.fromhex(seed))
    assert identity.public_key == bytes.fromhex(public)
    assert identity.seed == bytes.fromhex(seed)
    assert identity.sign(message) == bytes.fromhex(signature)
    assert verify_signature(bytes.fromhex(public), message, bytes.fromhex(signature))


def test_sign_and_verify_match_an_independent_implementation() -> None:
    identity = ServerIdentity.generate()
    theirs = Ed25519PrivateKey.from_private_bytes(identity.seed)
    message = b"status: replica-0 load=0.25"
    assert identity.sign(message) == theirs.sign(message)  # Ed25519 signatures are deterministic
    Ed25519PublicKey.from_public_bytes(identity.public_key).verify(identity.sign(message), message)
    assert verify_signature(identity.public_key, message, theirs.sign(message))


def test_identity_round_trips_through_its_seed() -> None:
    identity = ServerIdentity.generate()
    assert len(identity.seed) == SEED_SIZE
    assert len(identity.public_key) == PUBLIC_KEY_SIZE
    again = ServerIdentity.from_seed(identity.seed)
    assert again.public_key == identity.public_key
    assert ServerIdentity.generate().public_key != identity.public_key


def test_verify_refuses_changed_messages_signatures_and_signers() -> None:
    identity, other = ServerIdentity.generate(), ServerIdentity.generate()
    message = bytearray(b"replica-0 is trusted")
    signature = identity.sign(message)
    assert len(signature) == SIGNATURE_SIZE
    assert verify_signature(identity.public_key, message, signature)
    assert verify_signature(identity.public_key, memoryview(bytes(message)), signature)
    assert not verify_signature(other.public_key, message, signature)
    for i in range(len(message)):
        changed = bytearray(message)
        changed[i] ^= 1
        assert not verify_signature(identity.public_key, changed, signature)
    for i in range(SIGNATURE_SIZE):
        changed = bytearray(signature)
        changed[i] ^= 0x40
        assert not verify_signature(identity.public_key, message, bytes(changed))


@pytest.mark.parametrize(
    ("public_key", "signature", "message"),
    [
        (bytes(31), bytes(64), "public_key is 31 bytes, expected 32"),
        (bytes(32), bytes(63), "signature is 63 bytes, expected 64"),
        (bytes(33), bytes(65), "public_key is 33 bytes, expected 32"),
    ],
)
def test_verify_lengths_are_checked(public_key: bytes, signature: bytes, message: str) -> None:
    with pytest.raises(AuthError, match=f"^{message}$"):
        verify_signature(public_key, b"m", signature)


@given(
    public_key=st.binary(min_size=32, max_size=32),
    message=st.binary(max_size=64),
    sig=st.binary(min_size=64, max_size=64),
)
def test_verify_garbage_is_false_never_an_error(public_key: bytes, message: bytes, sig: bytes) -> None:
    assert verify_signature(public_key, message, sig) is False


@pytest.mark.parametrize("size", [0, 31, 33])
def test_seed_must_be_32_bytes(size: int) -> None:
    with pytest.raises(AuthError, match=rf"^seed is {size} bytes, expected 32$"):
        ServerIdentity.from_seed(bytes(size))


def test_identity_repr_hides_the_seed() -> None:
    seed = bytes.fromhex(RFC8032[0][0])
    identity = ServerIdentity.from_seed(seed)
    text = repr(identity)
    assert text == f"ServerIdentity(public_key=bytes.fromhex('{RFC8032[0][1]}'))"
    assert seed.hex() not in text
    assert repr(seed) not in text
