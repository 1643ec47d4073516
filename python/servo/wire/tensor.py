"""Tensors on the wire: raw little-endian bytes + dtype + shape, decoded without a copy."""

from __future__ import annotations

import math

import msgspec
import numpy as np
import numpy.typing as npt

from servo.wire.errors import WireError

#: dtypes a tensor may carry; the wire is always little-endian whatever the host is.
DTYPES: dict[str, np.dtype[np.generic]] = {
    name: np.dtype(name).newbyteorder("<")
    for name in ("float32", "float64", "float16", "int64", "int32", "uint8", "bool")
}

#: Default ceiling for one decoded tensor; observations carry a few kB of state and prefixes.
MAX_TENSOR_BYTES = 16 * 1024 * 1024


class Tensor(msgspec.Struct, frozen=True):
    """An n-d array: ``data`` holds ``prod(shape) * itemsize`` little-endian bytes."""

    dtype: str
    shape: tuple[int, ...]
    data: memoryview


def encode_tensor(array: npt.ArrayLike) -> Tensor:
    """Wrap an array for the wire; C-contiguous little-endian arrays are not copied."""
    arr = np.asarray(array)
    name = arr.dtype.name
    if name not in DTYPES:
        raise WireError(f"unsupported tensor dtype {name!r} (supported: {', '.join(DTYPES)})")
    arr = np.require(arr, dtype=DTYPES[name], requirements="C")
    return Tensor(dtype=name, shape=tuple(arr.shape), data=arr.reshape(-1).view(np.uint8).data)


def decode_tensor(
    tensor: Tensor,
    *,
    dtype: str | None = None,
    shape: tuple[int | None, ...] | None = None,
    max_bytes: int = MAX_TENSOR_BYTES,
    what: str = "tensor",
) -> npt.NDArray[np.generic]:
    """View the tensor's bytes as a read-only numpy array (zero-copy).

    Args:
        tensor: The decoded wire struct.
        dtype: If given, the dtype the tensor must have.
        shape: If given, the shape it must have; ``None`` entries match any size.
        max_bytes: Refuse tensors larger than this.
        what: Name used in error messages (e.g. ``"observation.state"``).

    Raises:
        WireError: unsupported dtype, negative or mismatched shape, byte count that does not
            match the shape, or a tensor over ``max_bytes``.
    """
    if tensor.dtype not in DTYPES:
        raise WireError(f"{what}: unsupported dtype {tensor.dtype!r} (supported: {', '.join(DTYPES)})")
    if dtype is not None and tensor.dtype != dtype:
        raise WireError(f"{what}: dtype is {tensor.dtype}, expected {dtype}")
    if any(d < 0 for d in tensor.shape):
        raise WireError(f"{what}: negative dimension in shape {tensor.shape}")
    if shape is not None and (
        len(shape) != len(tensor.shape)
        or any(want is not None and want != got for want, got in zip(shape, tensor.shape, strict=True))
    ):
        want = tuple("*" if d is None else d for d in shape)
        raise WireError(f"{what}: shape is {tensor.shape}, expected {want}")
    np_dtype = DTYPES[tensor.dtype]
    expected = math.prod(tensor.shape) * np_dtype.itemsize
    if expected > max_bytes:
        raise WireError(f"{what}: {expected} bytes exceeds the limit of {max_bytes}")
    if len(tensor.data) != expected:
        raise WireError(
            f"{what}: {len(tensor.data)} data bytes do not match shape {tensor.shape} "
            f"of {tensor.dtype} ({expected} bytes)"
        )
    return np.frombuffer(tensor.data, dtype=np_dtype).reshape(tensor.shape)


def decode_floats(
    tensor: Tensor,
    *,
    shape: tuple[int | None, ...] | None = None,
    max_bytes: int = MAX_TENSOR_BYTES,
    what: str = "tensor",
) -> npt.NDArray[np.float32]:
    """`decode_tensor` for a tensor that must be float32, as a native float32 array.

    Zero-copy on a little-endian host (the wire's byte order); converted on a big-endian one.

    Raises:
        WireError: see `decode_tensor`; also any dtype but float32.
    """
    return np.asarray(decode_tensor(tensor, dtype="float32", shape=shape, max_bytes=max_bytes, what=what), np.float32)
