"""openpi's message formats: msgpack-numpy frames, observation dicts, action replies.

openpi (Physical Intelligence) serves policies over a WebSocket: the server sends a metadata dict
on connect, then answers each msgpack observation dict with ``{"actions": (T, A) array, ...}``.
Arrays travel as msgpack maps with bytes keys, ``{b"__ndarray__": True, b"data": raw bytes,
b"dtype": "<f4", b"shape": [T, A]}`` (numpy scalars as ``b"__npgeneric__"``): plain data only.
This module reads and writes that format with msgspec, and maps an observation dict onto a
policy's features:

- the **state** is the concatenation, in order, of the values under `ObservationKeys.state`
  (``["state"]`` by default, as ALOHA-style clients send it; DROID-style clients send
  ``observation/joint_position`` and ``observation/gripper_position``);
- each **camera** ``<cam>`` of the policy is read from the key `ObservationKeys.cameras` maps it
  to, ``images/<cam>`` by default; frames are uint8 RGB, ``(H, W, 3)`` or channels-first
  ``(3, H, W)`` (ALOHA clients send the latter), of any size: whoever sends them declares their
  size for the session and the server resizes them to the policy's input, as a robot's
  (`check_sizes` holds frames to the sizes a session declared);
- the **prompt** (task instruction) is the string under `ObservationKeys.prompt`, optional.

A key is looked up as written first (DROID's keys contain slashes), then as a path through nested
dicts (``images/cam_high`` is ``obs["images"]["cam_high"]``). Every problem is a `WireError`
naming the key, what was expected and what came.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Annotated, Any

import msgspec
import numpy as np
import numpy.typing as npt

from servo.config import NonEmptyStr, doc
from servo.wire.errors import WireError
from servo.wire.messages import CameraFeature, Features, PolicyInfo

#: Array dtypes accepted from a peer: booleans, integers and floats (never objects or records).
_ARRAY_KINDS = frozenset("biuf")
#: Dimensions an array from a peer may have.
_MAX_NDIM = 8
#: Nesting of dicts and lists a peer may send (an observation dict needs two or three).
_MAX_DEPTH = 16
#: Control messages of openpi's protocol (``{"__ctrl__": "episode_start", ...}``).
CONTROL_KEY = "__ctrl__"
#: Where frames are unless the manifest maps a camera elsewhere: ``images/<camera>``.
IMAGES = "images"
#: The most a frame is enlarged to the policy's input; a smaller frame is refused (a 1x1 "image").
MAX_UPSCALE = 8

FloatArray = npt.NDArray[np.float32]
Frame = npt.NDArray[np.uint8]


class ObservationKeys(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """Where a policy's inputs are in an openpi observation dict."""

    state: Annotated[
        list[NonEmptyStr], doc("Keys whose values are concatenated, in order, into the state.", min_length=1)
    ] = msgspec.field(default_factory=lambda: ["state"])
    cameras: Annotated[
        dict[str, NonEmptyStr],
        doc("Policy camera name -> key of its frame; unlisted cameras come from images/<camera>."),
    ] = {}
    prompt: Annotated[NonEmptyStr, doc("Key of the task instruction (optional in each observation).")] = "prompt"

    def camera_key(self, camera: str) -> str:
        """The key a camera's frame is read from."""
        return self.cameras.get(camera, f"{IMAGES}/{camera}")


@dataclass(frozen=True)
class PolicyInput:
    """What a policy takes from one observation dict: state, frames (H, W, 3) and the prompt."""

    state: FloatArray
    images: dict[str, Frame]
    prompt: str


# ---------------------------------------------------------------------------- msgpack-numpy
def _pack_default(obj: Any) -> Any:
    if isinstance(obj, np.ndarray):
        array = np.ascontiguousarray(obj)
        return {
            b"__ndarray__": True,
            b"data": array.data.cast("B") if array.size else b"",
            b"dtype": array.dtype.str,
            b"shape": list(array.shape),
        }
    if isinstance(obj, np.generic):
        return {b"__npgeneric__": True, b"data": obj.item(), b"dtype": obj.dtype.str}
    raise TypeError(f"cannot send {type(obj).__name__} in an openpi message")


_encoder = msgspec.msgpack.Encoder(enc_hook=_pack_default)


def pack(message: Mapping[str, Any]) -> bytes:
    """Encode a dict (numpy arrays and scalars included) the way openpi's ``msgpack_numpy`` does."""
    return _encoder.encode(message)


def unpack(data: bytes, *, max_bytes: int) -> Any:
    """Decode an openpi message; arrays become read-only numpy views into ``data``'s copy.

    Raises:
        WireError: oversized, not msgpack, or an array marker that is malformed, of an
            unsupported dtype, or whose data does not match its shape.
    """
    if len(data) > max_bytes:
        raise WireError(f"message of {len(data)} bytes exceeds the limit of {max_bytes}")
    try:
        raw = msgspec.msgpack.decode(data)
    except msgspec.DecodeError as exc:
        raise WireError(f"not a msgpack message: {exc}") from None
    except RecursionError:
        raise WireError(f"message nested deeper than {_MAX_DEPTH} levels") from None
    return _arrays(raw, "$", 0)


def _arrays(node: Any, path: str, depth: int) -> Any:
    if isinstance(node, dict | list) and depth >= _MAX_DEPTH:
        raise WireError(f"{path}: nested deeper than {_MAX_DEPTH} levels")
    if isinstance(node, dict):
        if b"__ndarray__" in node:
            return _ndarray(node, path)
        if b"__npgeneric__" in node:
            return _npgeneric(node, path)
        return {key: _arrays(value, f"{path}.{key}", depth + 1) for key, value in node.items()}
    if isinstance(node, list):
        return [_arrays(value, f"{path}[{i}]", depth + 1) for i, value in enumerate(node)]
    return node


def _dtype(value: Any, path: str) -> np.dtype[Any]:
    try:
        dtype = np.dtype(value) if isinstance(value, str) else None
    except TypeError:
        dtype = None
    if dtype is None or dtype.kind not in _ARRAY_KINDS or dtype.fields or dtype.shape:
        raise WireError(f"{path}: unsupported array dtype {value!r} (booleans, integers and floats only)")
    return dtype


def _ndarray(node: dict[Any, Any], path: str) -> np.ndarray[Any, Any]:
    data, shape = node.get(b"data"), node.get(b"shape")
    dtype = _dtype(node.get(b"dtype"), path)
    if not isinstance(data, bytes):
        raise WireError(f"{path}: array data must be bytes")
    if (
        not isinstance(shape, list)
        or len(shape) > _MAX_NDIM
        or not all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in shape)
    ):
        raise WireError(f"{path}: array shape must be a list of at most {_MAX_NDIM} sizes, got {shape!r}")
    expected = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    if expected != len(data):
        raise WireError(f"{path}: {dtype} array of shape {tuple(shape)} needs {expected} bytes, got {len(data)}")
    return np.frombuffer(data, dtype=dtype).reshape(shape)


def _npgeneric(node: dict[Any, Any], path: str) -> Any:
    dtype = _dtype(node.get(b"dtype"), path)
    value = node.get(b"data")
    if not isinstance(value, bool | int | float):
        raise WireError(f"{path}: numpy scalar data must be a number, got {type(value).__name__}")
    if dtype.kind in "iu" and not (isinstance(value, int) and np.iinfo(dtype).min <= value <= np.iinfo(dtype).max):
        raise WireError(f"{path}: {value!r} is not a valid {dtype}")
    return dtype.type(value)


# ---------------------------------------------------------------------------- observation dicts
def _lookup(obs: Mapping[str, Any], key: str) -> tuple[bool, Any]:
    if key in obs:
        return True, obs[key]
    node: Any = obs
    for part in key.split("/"):
        if not isinstance(node, Mapping) or part not in node:
            return False, None
        node = node[part]
    return True, node


def _numeric(value: Any) -> np.ndarray[Any, Any] | None:
    if not isinstance(value, np.ndarray | np.generic | int | float | list):
        return None
    try:
        return np.asarray(value)
    except ValueError:  # a ragged list
        return None


def _keys_of(obs: Mapping[str, Any], shown: int = 8) -> str:
    keys = sorted(map(str, obs))
    listed = ", ".join(map(repr, keys[:shown]))
    return f"{listed}, …" if len(keys) > shown else listed or "no keys"


def _describe(value: Any) -> str:
    if isinstance(value, np.ndarray):
        return f"{value.dtype} {tuple(value.shape)}"
    return type(value).__name__


def read_observation(obs: Any, keys: ObservationKeys, features: Features) -> PolicyInput:
    """Map an openpi observation dict onto a policy's features (see the module docstring).

    Raises:
        WireError: a missing key, or a value of the wrong type, dtype, size or shape (named).
    """
    if not isinstance(obs, Mapping):
        raise WireError(f"an observation must be a dict, got {type(obs).__name__}")
    state = _state(obs, keys.state, features.state_names)
    images = {}
    for name, size in features.cameras.items():
        key = keys.camera_key(name)
        images[name] = _frame(obs, key, name)
        _refuse_tiny(images[name], key, name, size)
    _refuse_unknown_cameras(obs, keys, features)
    return PolicyInput(state=state, images=images, prompt=_prompt(obs, keys.prompt))


def _refuse_unknown_cameras(obs: Mapping[str, Any], keys: ObservationKeys, features: Features) -> None:
    """A frame under ``images/`` that no camera of the policy reads would be dropped without a word."""
    read = {keys.camera_key(name) for name in features.cameras}
    nested = obs.get(IMAGES)
    sent = [f"{IMAGES}/{name}" for name in nested] if isinstance(nested, Mapping) else []
    sent += [key for key in obs if isinstance(key, str) and key.startswith(f"{IMAGES}/")]
    for key in sent:
        if key not in read:
            raise WireError(
                f"{key!r}: the policy has no camera {key.removeprefix(IMAGES + '/')!r} (it has "
                f"{', '.join(features.cameras) or 'none'}); send only its cameras, or map yours in "
                "[frontends.openpi.observation] cameras"
            )


def _refuse_tiny(frame: Frame, key: str, camera: str, size: CameraFeature) -> None:
    """A frame the server would have to enlarge more than `MAX_UPSCALE` times is no camera's."""
    need = (-(-size.height // MAX_UPSCALE), -(-size.width // MAX_UPSCALE))
    if frame.shape[0] < need[0] or frame.shape[1] < need[1]:
        raise WireError(
            f"{key!r} (camera {camera!r}): a {frame.shape[0]}x{frame.shape[1]} frame; the policy takes "
            f"{size.height}x{size.width} and frames are enlarged at most {MAX_UPSCALE}x: send at least "
            f"{need[0]}x{need[1]} (height x width)"
        )


def frame_sizes(images: Mapping[str, Frame]) -> dict[str, CameraFeature]:
    """The size of each frame, as a session declares its cameras."""
    return {name: CameraFeature(int(frame.shape[0]), int(frame.shape[1])) for name, frame in images.items()}


def check_sizes(inputs: PolicyInput, cameras: Mapping[str, CameraFeature], keys: ObservationKeys) -> None:
    """Refuse frames whose size is not the one their session declared.

    Raises:
        WireError: naming the key, the camera, the size expected and the size sent.
    """
    for name, frame in inputs.images.items():
        size = cameras.get(name)
        if size is not None and frame.shape[:2] != (size.height, size.width):
            raise WireError(
                f"{keys.camera_key(name)!r} (camera {name!r}): this session's frames are {size.height}x{size.width} "
                f"(height x width), got {frame.shape[0]}x{frame.shape[1]}"
            )


def _state(obs: Mapping[str, Any], keys: list[str], names: list[str]) -> FloatArray:
    parts = []
    for key in keys:
        found, value = _lookup(obs, key)
        if not found:
            raise WireError(f"observation has no {key!r} (state); it has {_keys_of(obs)}")
        array = _numeric(value)
        if array is None or array.dtype.kind not in _ARRAY_KINDS or array.ndim > 1:
            raise WireError(f"{key!r}: expected a 1-D numeric array (state), got {_describe(value)}")
        parts.append(array.astype(np.float32).reshape(-1))
    state = np.concatenate(parts) if len(parts) > 1 else parts[0]
    if state.shape[0] != len(names):
        given = " + ".join(f"{key!r} ({part.shape[0]})" for key, part in zip(keys, parts, strict=True))
        raise WireError(
            f"state: {given} gives {state.shape[0]} values, the policy takes {len(names)} ({', '.join(names)})"
        )
    if not np.isfinite(state).all():
        raise WireError(f"state: {' + '.join(map(repr, keys))} contains NaN or inf")
    return state


def _frame(obs: Mapping[str, Any], key: str, camera: str) -> Frame:
    found, value = _lookup(obs, key)
    if not found:
        raise WireError(f"observation has no {key!r} (camera {camera!r}); map the camera to the key your client sends")
    if isinstance(value, np.ndarray) and value.dtype == np.uint8 and value.ndim == 3 and 0 not in value.shape:
        if value.shape[2] == 3:
            return value
        if value.shape[0] == 3:
            return np.ascontiguousarray(value.transpose(1, 2, 0))
    raise WireError(f"{key!r} (camera {camera!r}): expected uint8 (H, W, 3) or (3, H, W), got {_describe(value)}")


def _prompt(obs: Mapping[str, Any], key: str) -> str:
    found, value = _lookup(obs, key)
    if not found:
        return ""
    if not isinstance(value, str):
        raise WireError(f"{key!r} (prompt): expected a string, got {_describe(value)}")
    return value


# ---------------------------------------------------------------------------- replies
def policy_metadata(info: PolicyInfo, keys: ObservationKeys, *, replica: str, task: str) -> dict[str, Any]:
    """What servo tells an openpi-style client about the policy it serves (plain values only)."""
    features = info.features
    return {
        "model": info.model,
        "revision": info.revision,
        "replica": replica,
        "action_names": list(features.action_names),
        "state_names": list(features.state_names),
        "cameras": {name: [c.height, c.width] for name, c in features.cameras.items()},
        "chunk_size": info.chunk_size,
        "fps": info.fps,
        "task": task,
        "observation": {
            "state": list(keys.state),
            "cameras": {name: keys.camera_key(name) for name in features.cameras},
            "prompt": keys.prompt,
        },
    }


def action_reply(
    actions: FloatArray,
    *,
    infer_ms: float,
    policy_ms: float,
    queue_wait_ms: float,
    seq_id: int,
    episode_id: int,
    prev_total_ms: float | None = None,
) -> dict[str, Any]:
    """An openpi reply: ``actions`` (T, A) with openpi's timing dicts and servo's provenance.

    Args:
        actions: The chunk in robot space.
        infer_ms: Time from the observation to its chunk as the answering side measured it
            (openpi's ``server_timing.infer_ms``).
        policy_ms: The forward pass alone (openpi's ``policy_timing.infer_ms``).
        queue_wait_ms: Time the observation waited for the inference worker.
        seq_id: The servo request this answers (the audit log's join key, with the episode).
        episode_id: The servo episode.
        prev_total_ms: The previous request's whole cycle on the answering side, as openpi reports it.
    """
    server_timing = {"infer_ms": infer_ms, "queue_wait_ms": queue_wait_ms}
    if prev_total_ms is not None:
        server_timing["prev_total_ms"] = prev_total_ms
    return {
        "actions": actions,
        "server_timing": server_timing,
        "policy_timing": {"infer_ms": policy_ms},
        "servo": {"seq_id": seq_id, "episode_id": episode_id},
    }
