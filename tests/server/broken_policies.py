"""Policies that go wrong at start-up, for the one-line error tests of ``servo-serve``.

Loaded by module path from a manifest (``tests.server.broken_policies:make_nan``) in a child
process; none imports torch.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from servo.policy import PolicySpec
from tests.server.policies import RelativeProcessor, make_spec


class _Returns:
    def __init__(self, output: np.ndarray) -> None:
        self._output = output
        self._spec = make_spec(cameras={})

    @property
    def spec(self) -> PolicySpec:
        return self._spec

    def make_processor(self) -> RelativeProcessor:
        return RelativeProcessor()

    def predict_chunk(self, batch: Any, inference_delay: int, prefix: Any) -> np.ndarray:
        return self._output

    def reset(self) -> None:
        pass


def make_raising(**_: Any) -> Any:
    raise RuntimeError("checkpoint is corrupt")


def make_nan(**_: Any) -> _Returns:
    chunk = np.zeros((10, 6), np.float32)
    chunk[3, 2] = np.nan
    return _Returns(chunk)


def make_batched(**_: Any) -> _Returns:
    return _Returns(np.zeros((1, 10, 6), np.float32))


class _SpecCrashes:
    @property
    def spec(self) -> PolicySpec:
        raise KeyError("a bug in the adapter")


def make_spec_crash(**_: Any) -> _SpecCrashes:
    return _SpecCrashes()
