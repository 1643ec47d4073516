"""A server's trajectory library on the wire: the ``<p>/trajectory`` queryable (`ServerKeys.trajectory`).

A robot asks for a whole recorded trajectory (or the list of names) with a `TrajectoryRequest`.
Who asks proves it, as a session open does: the request names the robot (``client_id``) and is
signed by its Ed25519 identity (`trajectory_request_transcript`: every field, for the replica's
key prefix), so the replica admits it by the server's one admission rule (`servo.access`:
enrolled robots, any robot only on an open door) before it reads its library. The answer is encrypted to the
request's ephemeral X25519 ``client_key`` and signed by the replica over the request's fresh
``nonce`` (`servo.wire.sealed`, `servo.wire.trust.TRAJECTORY_CONTEXT`); a refusal is signed too
(`servo.wire.trust.rejection_transcript`). A captured request is worth nothing to anybody else:
its answer is readable only with the secret half of its ``client_key``.
"""

from __future__ import annotations

import msgspec

from servo.wire.messages import FeatureNames, Fps, Name, Nonce, OptionalPublicKey, OptionalSignature
from servo.wire.tensor import Tensor

#: What a robot signs when it asks for a trajectory (`trajectory_request_transcript`).
TRAJECTORY_REQUEST_CONTEXT = b"servo/3 trajectory-request\0"


class TrajectoryRequest(msgspec.Struct, frozen=True):
    """Robot -> server: fetch a named trajectory (``name=""`` lists the library).

    ``client_id`` and ``robot_key`` name the robot asking, ``signature`` is its Ed25519
    signature over `trajectory_request_transcript`; ``nonce`` (fresh, random) and ``client_key`` (an
    ephemeral X25519 key) are what the sealed answer is bound and encrypted to.
    """

    name: Name = ""
    nonce: Nonce = b""
    client_key: OptionalPublicKey = b""
    client_id: Name = ""
    robot_key: OptionalPublicKey = b""
    signature: OptionalSignature = b""


def trajectory_request_transcript(request: TrajectoryRequest, prefix: str) -> bytes:
    """What a trajectory request's robot signs: every field but the signature, for the replica at ``prefix``."""
    fields = [prefix, request.name, request.nonce, request.client_key, request.client_id, request.robot_key]
    return TRAJECTORY_REQUEST_CONTEXT + msgspec.msgpack.encode(fields)


class Trajectory(msgspec.Struct, frozen=True):
    """A whole trajectory in one transfer: positions (T, D) at ``fps``."""

    name: str
    joint_names: FeatureNames
    fps: Fps
    positions: Tensor


class TrajectoryList(msgspec.Struct, frozen=True):
    """The names of a server's trajectory library."""

    names: list[str]
