"""Device placement: the device a policy is asked to run on exists, and its weights are really there.

A policy factory receives the device (``factory(**options, device=...)``) and builds its modules
on it. `check_placement` then looks at every torch module the policy holds and refuses a policy
whose parameters or buffers sit elsewhere — a factory that ignores the device would otherwise run
a "cuda" model on the CPU, silently.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from servo.policy.errors import PolicyLoadError

if TYPE_CHECKING:
    import torch


def check_device(device: str, *, key: str = "model.device") -> None:
    """Refuse a device torch cannot use here, in one line naming ``key``.

    Raises:
        PolicyLoadError: malformed device, no CUDA / MPS, or a CUDA index past the last GPU.
    """
    import torch

    try:
        parsed = torch.device(device)
    except (RuntimeError, ValueError):
        raise PolicyLoadError(f"{key}: {device!r} is not a torch device (cpu, cuda, cuda:N, mps)") from None
    if parsed.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            raise PolicyLoadError(f"{key}: {device!r} requested but torch sees no CUDA device on this machine")
        if parsed.index is not None and parsed.index >= count:
            raise PolicyLoadError(f"{key}: {device!r} requested but torch sees only {count} CUDA device(s)")
    elif parsed.type == "mps" and not torch.backends.mps.is_available():
        raise PolicyLoadError(f"{key}: {device!r} requested but MPS (Apple GPU) is not available on this machine")


def check_placement(policy: Any, device: str, *, key: str = "model.device") -> None:
    """Every parameter and buffer of the policy's torch modules must be on ``device``.

    Raises:
        PolicyLoadError: naming the first module found elsewhere.
    """
    import torch

    want = torch.device(device)
    for name, module in torch_modules(policy):
        for tensor in (*module.parameters(), *module.buffers()):
            if not _same(tensor.device, want):
                raise PolicyLoadError(
                    f"{key}: {device!r} requested, but the policy's {name} has weights on {tensor.device} "
                    "(does its factory build its modules on the `device` it is given?)"
                )


def torch_modules(policy: Any) -> Iterator[tuple[str, torch.nn.Module]]:
    """The torch modules a policy holds: itself, or its attributes (one level deep)."""
    import torch

    if isinstance(policy, torch.nn.Module):
        yield type(policy).__name__, policy
        return
    for attr, value in vars(policy).items() if hasattr(policy, "__dict__") else ():
        if isinstance(value, torch.nn.Module):
            yield attr, value


def _same(have: torch.device, want: torch.device) -> bool:
    if have.type != want.type:
        return False
    # "cuda" means the current CUDA device, which is index 0 unless the process changed it.
    return want.index is None or (have.index or 0) == want.index
