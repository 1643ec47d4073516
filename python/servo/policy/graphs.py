"""CUDA graphs for a policy's fixed-shape networks (``model.cuda_graphs``).

A robot policy's forward has the same shapes request after request (one batch size, fixed
camera sizes), so its kernel launches can be recorded once and replayed: on a GPU that removes
the per-kernel launch cost, which dominates small networks. `GraphedCallable` records one graph
per input signature on first use (the server's warm-up covers every batch size it will serve)
and replays it afterwards. Off CUDA it runs its CPU twin: the same static buffers, copies and
bookkeeping, with a "replay" that calls the function, so the CPU tests exercise everything but
the capture itself.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

#: Warm-up runs on a side stream before a capture (CUDA's own recipe: lazy init, autotuning).
_WARMUP_RUNS = 3


@dataclass
class _Graph:
    inputs: list[torch.Tensor]
    output: torch.Tensor
    replay: Callable[[], None]


class GraphedCallable:
    """``fn(*tensors) -> tensor`` replayed from a recorded graph per input signature.

    The first call with a new signature (shapes, dtypes, devices) records it; later calls copy
    their inputs into the recorded ones, replay, and return a copy of the recorded output. At
    most ``max_graphs`` signatures are recorded; others run ``fn`` directly. ``fn`` must be a
    pure function of its tensor inputs with no host synchronisation (no ``.item()``, ``.cpu()``).
    Owned by the inference thread.
    """

    def __init__(self, fn: Callable[..., torch.Tensor], *, max_graphs: int = 32) -> None:
        self._fn = fn
        self._max = max_graphs
        self._graphs: dict[tuple[object, ...], _Graph] = {}

    @property
    def captured(self) -> int:
        """How many signatures have a recorded graph."""
        return len(self._graphs)

    def __call__(self, *args: torch.Tensor) -> torch.Tensor:
        """``fn(*args)``, replayed when this signature was recorded."""
        key = tuple((tuple(a.shape), a.dtype, a.device) for a in args)
        graph = self._graphs.get(key)
        if graph is None:
            if len(self._graphs) >= self._max:
                return self._fn(*args)
            graph = self._graphs[key] = self._record(args)
        for static, value in zip(graph.inputs, args, strict=True):
            static.copy_(value)
        graph.replay()
        return graph.output.clone()

    def _record(self, args: tuple[torch.Tensor, ...]) -> _Graph:
        import torch

        inputs = [a.clone() for a in args]
        if not all(a.is_cuda for a in args):
            # The CPU twin: same buffers and copies, the "replay" recomputes into the output.
            output = self._fn(*inputs)

            def recompute() -> None:
                output.copy_(self._fn(*inputs))

            return _Graph(inputs, output, recompute)
        side = torch.cuda.Stream(inputs[0].device)
        side.wait_stream(torch.cuda.current_stream(inputs[0].device))
        with torch.cuda.stream(side):
            for _ in range(_WARMUP_RUNS):
                self._fn(*inputs)
        torch.cuda.current_stream(inputs[0].device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            output = self._fn(*inputs)
        return _Graph(inputs, output, graph.replay)
