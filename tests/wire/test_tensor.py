import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from servo.wire import Tensor, WireError, decode, decode_tensor, encode, encode_tensor

DTYPES = ["float32", "float64", "float16", "int64", "int32", "uint8", "bool"]


@given(
    hnp.arrays(
        dtype=st.sampled_from(DTYPES),
        shape=hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=6),
    )
)
def test_round_trip_is_exact(array: np.ndarray) -> None:
    back = decode_tensor(decode(encode(encode_tensor(array)), Tensor))
    assert back.dtype == array.dtype.newbyteorder("<")
    assert back.shape == array.shape
    assert back.tobytes() == array.astype(array.dtype.newbyteorder("<")).tobytes()


def test_decode_is_a_view_of_the_message_buffer() -> None:
    buf = encode(encode_tensor(np.arange(12, dtype=np.float32).reshape(3, 4)))
    arr = decode_tensor(decode(buf, Tensor))
    assert not arr.flags.owndata
    assert not arr.flags.writeable
    assert arr.base is not None


def test_big_endian_input_goes_out_little_endian() -> None:
    src = np.arange(4, dtype=">f4")
    wire = encode_tensor(src)
    assert bytes(wire.data) == np.arange(4, dtype="<f4").tobytes()


def test_non_contiguous_input_is_handled() -> None:
    src = np.arange(20, dtype=np.float32).reshape(4, 5)[:, ::2]
    np.testing.assert_array_equal(decode_tensor(encode_tensor(src)), src)


@pytest.mark.parametrize(
    ("tensor", "kwargs", "message"),
    [
        (Tensor("complex64", (1,), memoryview(b"\0" * 8)), {}, "unsupported dtype 'complex64'"),
        (
            Tensor("float32", (2, 3), memoryview(b"\0" * 20)),
            {},
            "20 data bytes do not match shape (2, 3)",
        ),
        (Tensor("float32", (-1,), memoryview(b"")), {}, "negative dimension"),
        (
            Tensor("float32", (4,), memoryview(b"\0" * 16)),
            {"dtype": "float64"},
            "dtype is float32, expected float64",
        ),
        (
            Tensor("float32", (4,), memoryview(b"\0" * 16)),
            {"shape": (6,)},
            "shape is (4,), expected (6,)",
        ),
        (
            Tensor("float32", (2, 4), memoryview(b"\0" * 32)),
            {"shape": (None, 3)},
            "expected ('*', 3)",
        ),
        (Tensor("uint8", (10**6, 10**6), memoryview(b"")), {}, "exceeds the limit"),
    ],
)
def test_bad_tensors_are_refused_with_a_reason(tensor: Tensor, kwargs: dict, message: str) -> None:
    with pytest.raises(WireError, match=message.replace("(", r"\(").replace(")", r"\)").replace("*", r"\*")):
        decode_tensor(tensor, **kwargs)


def test_unsupported_dtype_refused_on_encode() -> None:
    with pytest.raises(WireError, match="complex128"):
        encode_tensor(np.zeros(3, dtype=np.complex128))
