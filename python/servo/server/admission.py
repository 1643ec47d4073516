"""Bounds on what a remote peer may make the server do, checked before the work they guard.

The numbers come from the manifest's ``[limits]`` (`servo.server.manifest.LimitsSection`):

* **Rates** (`TokenBucket`, `KeyedBuckets`): session opens for everyone together and per client
  id, checked before the handshake; observations per session, checked once the observation is
  authenticated (so a peer without the key cannot spend a robot's budget) and before its mailbox.
* **Who streamed here** (`ReturningRobots`): robot keys that sent an authenticated observation,
  so a flood of never-seen identities cannot spend a returning robot's open budget or slot.
* **Pixels** (`camera_shapes`, `ImageGate`): at session open every camera the policy needs must
  declare at most ``max_image_pixels`` and all of them together at most
  ``decode_budget_pixels`` (every request of the session decodes exactly those frames, so this
  is the per-request decode budget). Each observation's frames must then have exactly the
  declared sizes, a JPEG's read from its frame header (`servo.wire.jpeg_dimensions`): a
  decompression bomb is refused in microseconds, before libjpeg sees a byte of it.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable, Mapping

import msgspec

from servo.server.manifest import LimitsSection
from servo.wire import EncodedImage, Features, Rejection, WireError, decode, jpeg_dimensions
from servo.wire.messages import ByCamera

Shapes = Mapping[str, tuple[int, int]]
#: Most robot keys remembered as having streamed on this replica.
MAX_RETURNING = 4096


class TokenBucket:
    """Refills at ``rate`` tokens per second up to ``burst``; each `take` spends one.

    Thread-safe (a per-session bucket is spent on Zenoh's callback threads).
    """

    def __init__(self, rate: float, burst: int, clock: Callable[[], float] = time.monotonic) -> None:
        self._rate, self._burst, self._clock = rate, float(burst), clock
        self._tokens, self._at = float(burst), clock()
        self._lock = threading.Lock()

    def take(self) -> bool:
        """Spend one token; False when the bucket is empty."""
        with self._lock:
            now = self._clock()
            self._tokens = min(self._burst, self._tokens + (now - self._at) * self._rate)
            self._at = now
            if self._tokens < 1.0:
                return False
            self._tokens -= 1.0
            return True


class KeyedBuckets:
    """One `TokenBucket` per key (e.g. client id), at most ``max_keys`` of them. Event loop.

    The least recently used key is forgotten first: an attacker inventing keys only forgets its
    own buckets (a forgotten key starts again with a full burst, which the global bucket bounds).
    """

    def __init__(
        self, rate: float, burst: int, *, max_keys: int = 4096, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._rate, self._burst, self._max_keys, self._clock = rate, burst, max_keys, clock
        self._buckets: OrderedDict[Hashable, TokenBucket] = OrderedDict()

    def take(self, key: Hashable) -> bool:
        """Spend one token of ``key``'s bucket; False when it is empty."""
        bucket = self._buckets.pop(key, None)
        if bucket is None:
            bucket = TokenBucket(self._rate, self._burst, self._clock)
            if len(self._buckets) >= self._max_keys:
                self._buckets.popitem(last=False)
        self._buckets[key] = bucket
        return bucket.take()


class ReturningRobots:
    """Robot keys that streamed on this replica (an authenticated observation), most recent last.

    Thread-safe: marked on Zenoh's observation thread, read by the event loop. Bounded by
    `MAX_RETURNING`, the least recently seen forgotten first.
    """

    def __init__(self) -> None:
        self._keys: OrderedDict[bytes, None] = OrderedDict()
        self._lock = threading.Lock()

    def add(self, key: bytes) -> None:
        """``key`` streamed (again)."""
        with self._lock:
            self._keys[key] = None
            self._keys.move_to_end(key)
            if len(self._keys) > MAX_RETURNING:
                self._keys.popitem(last=False)

    def __contains__(self, key: object) -> bool:
        with self._lock:
            return key in self._keys


def camera_shapes(client: Features, policy: Features, limits: LimitsSection) -> dict[str, tuple[int, int]] | Rejection:
    """The frame sizes a session's observations must have, within the limits.

    They are what the client declared for each camera the policy needs (the open was validated,
    so every one is there).

    Returns a ``cameras`` `Rejection` when a camera exceeds ``max_image_pixels`` or all of them
    together exceed ``decode_budget_pixels``.
    """
    shapes = {name: (client.cameras[name].height, client.cameras[name].width) for name in policy.cameras}
    for name, (h, w) in shapes.items():
        if h * w > limits.max_image_pixels:
            return Rejection(
                "cameras", f"camera {name!r} declares {h}x{w}: more than the server's {limits.max_image_pixels} pixels"
            )
    total = sum(h * w for h, w in shapes.values())
    if total > limits.decode_budget_pixels:
        return Rejection(
            "cameras",
            f"cameras declare {total} pixels per observation: more than the server's decode budget of "
            f"{limits.decode_budget_pixels}",
        )
    return shapes


def input_sizes(shapes: Shapes, policy: Features) -> dict[str, tuple[int, int]]:
    """The cameras a client may send at the policy's input size instead of its declared ``shapes``.

    Those declared larger (in both dimensions, and not equal): the server shrinks such frames to
    the policy's size itself (`servo.server.decoding`), so the client may as well send them so.
    """
    sizes = {name: (cam.height, cam.width) for name, cam in policy.cameras.items()}
    return {
        name: (h, w)
        for name, (h, w) in sizes.items()
        if (h, w) != shapes[name] and h <= shapes[name][0] and w <= shapes[name][1]
    }


class _Images(msgspec.Struct, frozen=True):
    """An observation's images only: the rest of the body is skipped, the frames stay zero-copy."""

    images: ByCamera[EncodedImage] = {}


class ImageGate:
    """Refuses an observation whose frames are not the sizes its session declared, undecoded.

    Immutable; made at session open and called on Zenoh's callback threads.

    Args:
        shapes: (height, width) of every camera the policy reads (from `camera_shapes`).
        max_bytes: The observation size bound.
        smaller: The policy's input size of the cameras that may be sent at it instead (`input_sizes`).
    """

    def __init__(self, shapes: Shapes, *, max_bytes: int, smaller: Shapes | None = None) -> None:
        # The field path each camera's errors name, formatted once per session, not per observation.
        self._frames = {
            name: (shape, (smaller or {}).get(name, shape), f"observation.images[{name!r}]")
            for name, shape in shapes.items()
        }
        self._max_bytes = max_bytes

    def check(self, body: bytes) -> None:
        """Check the declared and the JPEG-header sizes of every frame the policy reads.

        Raises:
            WireError: naming the camera and both sizes.
        """
        images = decode(body, _Images, max_bytes=self._max_bytes).images
        for name, (declared, small, what) in self._frames.items():
            image = images.get(name)
            if image is None:
                raise WireError(f"observation has no image for camera {name!r}")
            size = (image.height, image.width)
            if size not in (declared, small):
                also = "" if small == declared else f" (or {small[0]}x{small[1]})"
                raise WireError(
                    f"{what}: size {size[0]}x{size[1]}, the session declared {declared[0]}x{declared[1]}{also}"
                )
            if image.codec == "jpeg":
                jh, jw = jpeg_dimensions(image.data, what=what)
                if (jh, jw) != size:
                    raise WireError(f"{what}: JPEG header says {jh}x{jw}, the message declares {size[0]}x{size[1]}")
