"""Camera frames onto the policy's device: pinned host buffers, non-blocking copies, JPEG on the GPU.

A decoded observation's frames are ``(H, W, 3)`` uint8 arrays on the host, or, when the server
decodes onto the device (``model.frames``, `servo.server.decoding`), torch tensors already
there. Processors turn either into one device tensor with `stack_on_device`, so the same policy
code runs both ways.

On CUDA a host frame is copied once into a page-locked (pinned) buffer and from there to the
device without blocking the calling thread; JPEG frames are decoded by nvJPEG
(``torchvision.io.decode_jpeg``) straight into device memory. Elsewhere the same code runs as its
CPU twin: plain tensors, libjpeg through torchvision, no streams. Both are exercised by the CPU
tests; only the CUDA branches need a GPU.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from servo.policy.errors import PolicyLoadError

if TYPE_CHECKING:
    import torch


def is_cuda(device: str) -> bool:
    """Whether ``device`` names a CUDA device (``cuda``, ``cuda:N``)."""
    return device.split(":", 1)[0] == "cuda"


def jpeg_on_device_available() -> str | None:
    """None if frames can be decoded onto a device here, else why not (one line)."""
    try:
        import torchvision.io  # noqa: F401
    except ImportError as exc:
        return f"torchvision is not importable ({exc}): pip install 'servo-robotics[server]'"
    return None


class PinnedStager:
    """Copies host frames to a device through reusable page-locked buffers, without blocking.

    One pinned buffer per frame shape, reused once the copy that last used it has finished
    (a CUDA event says so); on a non-CUDA device the twin copies directly. Owned by one thread.
    """

    def __init__(self, device: str) -> None:
        import torch

        self.device = torch.device(device)
        self._cuda = is_cuda(device)
        self._buffers: dict[tuple[int, ...], tuple[torch.Tensor, Any]] = {}

    def to_device(self, frame: np.ndarray) -> torch.Tensor:
        """``frame`` as a tensor on the device; on CUDA the copy runs on the current stream."""
        import torch

        if not self._cuda:
            return torch.from_numpy(np.array(frame, copy=True)).to(self.device)
        shape = tuple(frame.shape)
        entry = self._buffers.get(shape)
        if entry is None:
            entry = (torch.empty(shape, dtype=torch.uint8, pin_memory=True), torch.cuda.Event())
            self._buffers[shape] = entry
        pinned, done = entry
        done.synchronize()  # the previous copy out of this buffer has finished
        pinned.numpy()[...] = frame
        out = pinned.to(self.device, non_blocking=True)
        done.record()
        return out


def stack_on_device(frames: Sequence[Any], device: str, stager: PinnedStager | None = None) -> torch.Tensor:
    """Frames (host arrays or device tensors, all ``(H, W, 3)`` uint8) as one ``(N, H, W, 3)`` device tensor."""
    import torch

    tensors = [frame if isinstance(frame, torch.Tensor) else _host_to_device(frame, device, stager) for frame in frames]
    return torch.stack([t.to(device) for t in tensors])


def _host_to_device(frame: np.ndarray, device: str, stager: PinnedStager | None) -> torch.Tensor:
    import torch

    if stager is not None:
        return stager.to_device(frame)
    # Decoded frames may be read-only views of the message: torch wants its own memory.
    return torch.from_numpy(frame if frame.flags.writeable else frame.copy()).to(device)


class DeviceFrameDecoder:
    """Decodes an observation's frames straight onto the policy's device.

    JPEG through ``torchvision.io.decode_jpeg`` on the device (nvJPEG on CUDA, batched across
    the cameras), raw frames through a `PinnedStager`. On CUDA the work runs on a side stream,
    and `decode` returns once it has finished, so the worker's forward on the default stream
    reads finished frames. Owned by the server's receive thread.

    Raises:
        PolicyLoadError: torchvision cannot be imported.
    """

    def __init__(self, device: str) -> None:
        import torch

        if (problem := jpeg_on_device_available()) is not None:
            raise PolicyLoadError(f"model.frames = 'device': {problem}")
        self.device = torch.device(device)
        self._cuda = is_cuda(device)
        self._stream = torch.cuda.Stream(self.device) if self._cuda else None
        self._stager = PinnedStager(device)
        # torchvision 0.29 deprecates its image codecs in favour of TorchCodec but keeps them
        # (nvJPEG included); the warning would fire on every observation.
        warnings.filterwarnings("ignore", message="The image decoding and encoding capabilities of TorchVision")

    def decode(self, jpegs: Mapping[str, bytes | memoryview], raw: Mapping[str, np.ndarray]) -> dict[str, torch.Tensor]:
        """Every frame on the device, ``(H, W, 3)`` uint8, by camera name.

        Raises:
            RuntimeError: a JPEG torchvision cannot decode (the caller names the camera).
        """
        import torch
        from torchvision.io import ImageReadMode, decode_jpeg

        on_stream = torch.cuda.stream(self._stream) if self._stream is not None else contextlib.nullcontext()
        with on_stream:
            out: dict[str, torch.Tensor] = {name: self._stager.to_device(frame) for name, frame in raw.items()}
            if jpegs:
                data = [torch.frombuffer(bytearray(body), dtype=torch.uint8) for body in jpegs.values()]
                images = decode_jpeg(data, mode=ImageReadMode.RGB, device=self.device)
                out.update({name: image.permute(1, 2, 0) for name, image in zip(jpegs, images, strict=True)})
        if self._stream is not None:
            self._stream.synchronize()
            consumer = torch.cuda.default_stream(self.device)
            for tensor in out.values():
                tensor.record_stream(consumer)  # freed later on the worker's stream: keep it until then
        return out
