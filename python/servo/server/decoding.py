"""Observation decoding, before the mailbox: the inference worker never decodes.

The worker owns the device and spends its time on forward passes only. Decoding an observation
(msgpack, tensor checks, two 480x640 JPEGs: ~1 ms each, the cameras in parallel) runs on the
intake thread that authenticated it (`servo.server.intake`: the Zenoh callback thread, or a lane
of `servo.server.lanes` on a multi-core server), while the device runs other sessions' forwards,
so at N clients the device never idles waiting for JPEG and no thread hop separates an
authenticated arrival from its mailbox. A message's second and later frames to
decode go to the decoder's stage threads ("servo-decode-<n>", one fewer than the policy has
cameras: the callback thread decodes the first itself). `ObservationDecoder.__call__` is the single
entry point from an authenticated message to what a processor takes.
"""

from __future__ import annotations

import itertools
import time
from typing import Literal, cast

import numpy as np

from servo._core import Header
from servo.logs import LogThrottle, get_logger
from servo.policy import DecodedObservation, PolicySpec
from servo.policy.frames import DeviceFrameDecoder, is_cuda, jpeg_on_device_available
from servo.policy.protocol import Frame
from servo.policy.runner import clamp_delay
from servo.server.sessions import Decoded, Mail, Rejected, Session
from servo.stages import NotRun, StageThread
from servo.wire import EncodedImage, Observation, WireError, decode, decode_floats, decode_image, downsize
from servo.wire.image import jpeg_dimensions

log = get_logger(__name__)
#: A codec bug shows its traceback once per second at most, with the count held back.
_THROTTLE = LogThrottle(1.0)

#: ``model.frames``: where frames are decoded (see `device_frames_for`).
FramesMode = Literal["auto", "host", "device"]


def device_frames_for(mode: FramesMode, device: str, spec: PolicySpec) -> DeviceFrameDecoder | None:
    """The device decoder ``model.frames`` asks for, or None to decode on the host.

    ``auto`` decodes onto the device when it is CUDA, the policy's processors take device frames
    (``spec.device_frames``) and torchvision is importable; ``device`` always does (on the CPU it
    runs the CPU twin: torchvision's decoder, plain tensors); ``host`` never does.

    Raises:
        PolicyLoadError: ``device`` without torchvision.
    """
    if mode == "host":
        return None
    if mode == "auto":
        if not (is_cuda(device) and spec.device_frames):
            return None
        if (problem := jpeg_on_device_available()) is not None:
            log.warning("decoding frames on the host", reason=problem)
            return None
    return DeviceFrameDecoder(device)


class ObservationDecoder:
    """Turns a session's raw observation into what its processor takes.

    Stateless apart from the policy's feature shapes and its stages; called from the Zenoh
    intake threads (any thread may call it: stages take jobs from any thread).
    """

    def __init__(
        self,
        spec: PolicySpec,
        *,
        max_observation_bytes: int,
        pin_task: bool,
        device_frames: DeviceFrameDecoder | None = None,
        callers: int = 1,
    ) -> None:
        self._state_dim = len(spec.features.state_names)
        self._action_dim = len(spec.features.action_names)
        self._cameras = tuple(spec.features.cameras)
        # The policy's input size: a JPEG twice as large or more is decoded scaled down (DCT domain).
        self._targets = {name: (cam.height, cam.width) for name, cam in spec.features.cameras.items()}
        self._what = {name: f"observation.images[{name!r}]" for name in self._cameras}
        self._chunk_size = spec.chunk_size
        self._max_bytes = max_observation_bytes
        self._pin_task = pin_task
        self._device = device_frames
        # libjpeg-turbo releases the GIL: several cameras of one observation decode in parallel,
        # and so do the observations of ``callers`` threads (`servo.server.lanes`).
        self._stages = [StageThread(f"servo-decode-{n}") for n in range(1, 1 + callers * (len(self._cameras) - 1))]
        self._turn = itertools.count()

    def close(self) -> None:
        """Close the stages: a decode waiting on one is refused (``server_closing``)."""
        for stage in self._stages:
            stage.close()

    def __call__(self, header: Header, payload: bytes, received_ns: int, session: Session) -> Mail:
        """Decode an authenticated observation of ``session`` that arrived at ``received_ns``.

        Anything wrong becomes a `Rejected` naming the problem.
        """
        started = time.monotonic_ns()
        try:
            obs, delay = self._decode(header, payload, session)
        except WireError as exc:
            return Rejected(header, "bad_observation", str(exc), received_ns)
        except NotRun:
            return Rejected(header, "server_closing", "the server is closing", received_ns)
        except Exception as exc:  # a codec bug must cost one request, not the intake thread
            if (suppressed := _THROTTLE.allow(type(exc).__name__)) is not None:
                log.exception("observation decoding failed", session_id=session.session_id, suppressed=suppressed)
            return Rejected(header, "bad_observation", f"{type(exc).__name__}: {exc}", received_ns)
        ready_ns = time.monotonic_ns()
        return Decoded(header, obs, delay, received_ns, ready_ns - started, ready_ns)

    def _decode(self, header: Header, payload: bytes, session: Session) -> tuple[DecodedObservation, int]:
        if header.schema_version != session.schema_version:
            raise WireError(
                f"observation uses schema version {header.schema_version}, the session negotiated "
                f"{session.schema_version}"
            )
        msg = decode(payload, Observation, max_bytes=self._max_bytes)
        state = decode_floats(msg.state, shape=(self._state_dim,), what="observation.state")
        if not np.isfinite(state).all():
            raise WireError("observation.state contains NaN or inf")
        prefix_model = prefix_robot = None
        if session.rtc:
            shape = (None, self._action_dim)
            if msg.prefix_model is not None:
                prefix_model = decode_floats(msg.prefix_model, shape=shape, what="observation.prefix_model")
            if msg.prefix_robot is not None:
                prefix_robot = decode_floats(msg.prefix_robot, shape=shape, what="observation.prefix_robot")
        delay = clamp_delay(msg.inference_delay_steps, self._chunk_size)
        obs = DecodedObservation(
            state=state,
            images=self._images(msg.images),
            task=session.task if self._pin_task or not msg.task else msg.task,
            prefix_model=prefix_model,
            prefix_robot=prefix_robot,
        )
        return obs, delay

    def _shrinks(self, image: EncodedImage, name: str) -> bool:
        """Whether ``image`` is larger than the policy's input (in both dimensions: then it is shrunk)."""
        h, w = self._targets[name]
        return (image.height, image.width) != (h, w) and image.height >= h and image.width >= w

    def _frame(self, image: EncodedImage, name: str) -> Frame:
        """One camera's frame at the policy's input size when it was larger (`servo.wire.downsize`).

        The same function the edge shrinks with before it sends (when the session ack offers
        it), so the policy sees the same pixels either way.
        """
        target = self._targets[name]
        frame = decode_image(image, target=target, what=self._what[name])
        if self._shrinks(image, name):
            frame = downsize(frame, target)
            frame.flags.writeable = False  # read-only, like every frame a policy gets
        return frame

    def _images(self, images: dict[str, EncodedImage]) -> dict[str, Frame]:
        for name in self._cameras:
            if name not in images:
                raise WireError(f"observation has no image for camera {name!r}")
        if self._device is not None:
            # Decoded on the device as sent: the edge's shrinking is what makes them the policy's size.
            return self._device_images(images, self._device)
        # JPEG decodes, and shrinking any frame, run in parallel: both release the GIL.
        slow = [name for name in self._cameras if images[name].codec == "jpeg" or self._shrinks(images[name], name)]
        futures = {name: self._next_stage().submit(self._frame, images[name], name) for name in slow[1:]}
        out = {}
        try:
            for name in self._cameras:
                if name not in futures:
                    out[name] = self._frame(images[name], name)
        finally:
            for name, future in futures.items():
                out[name] = future.result()  # re-raises the camera's WireError
        return {name: out[name] for name in self._cameras}

    def _next_stage(self) -> StageThread:
        """The stage whose turn it is: round robin, so concurrent callers spread over all of them."""
        return self._stages[next(self._turn) % len(self._stages)]

    def _device_images(self, images: dict[str, EncodedImage], device: DeviceFrameDecoder) -> dict[str, Frame]:
        """Every frame decoded onto the policy's device (the caller checked every camera is there)."""
        jpegs, raw = {}, {}
        for name in self._cameras:
            image = images[name]
            if image.codec == "jpeg":
                if jpeg_dimensions(image.data, what=self._what[name]) != (image.height, image.width):
                    raise WireError(f"{self._what[name]}: the JPEG's size is not the size the message declares")
                jpegs[name] = image.data
            else:
                raw[name] = decode_image(image, what=self._what[name])  # checks codec and size: a view
        try:
            frames = device.decode(jpegs, raw)
        except RuntimeError as exc:
            raise WireError(f"observation.images: corrupt JPEG ({exc})") from exc
        # Device tensors where a policy that declares device_frames expects them (see DecodedObservation).
        return cast(dict[str, Frame], {name: frames[name] for name in self._cameras})
