"""Policy sources: the explicit registry of built-ins, or any importable ``module:factory``.

A factory is called as ``factory(**options, device=device)`` (``device`` only if its signature
takes it or ``**kwargs``) and must build its modules on that device; `load_policy` checks that
they are there.
"""

from __future__ import annotations

import importlib
import inspect
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from servo.config import ConfigError
from servo.policy.device import check_device, check_placement
from servo.policy.errors import PolicyLoadError
from servo.policy.protocol import Policy


def _reference(**options: Any) -> Policy:
    from servo.policy.reference import make_reference_policy

    return make_reference_policy(**options)


def _lerobot(**options: Any) -> Policy:
    from servo.policy.lerobot import make_lerobot_policy

    return make_lerobot_policy(**options)


#: Built-in policy sources. Adding an adapter = one entry here, never an import side effect.
POLICIES: dict[str, Callable[..., Policy]] = {"reference": _reference, "lerobot": _lerobot}

_REQUIRED = ("spec", "make_processor", "predict_chunk", "reset")


@dataclass(frozen=True)
class PolicyKeys:
    """The configuration keys error messages name (the manifest's by default; the edge has its own)."""

    source: str = "model.source"
    options: str = "model.options"
    device: str = "model.device"


MANIFEST_KEYS = PolicyKeys()


def load_policy(
    source: str,
    options: Mapping[str, Any] | None = None,
    *,
    device: str = "cpu",
    search_path: str | Path | None = None,
    keys: PolicyKeys = MANIFEST_KEYS,
) -> Policy:
    """Instantiate a policy on ``device`` from a built-in name or ``package.module:factory``.

    Args:
        source: A key of `POLICIES` or ``package.module:factory``.
        options: Keyword arguments of the factory.
        device: torch device the policy must be built on (checked before and after).
        search_path: A directory ``package.module`` may also be imported from (the manifest's).
        keys: Configuration keys named in error messages.

    Raises:
        PolicyLoadError: unknown source, import failure, bad options, a factory that fails, an
            object without the chunk API, or a device that is unavailable or not where the
            weights ended up. One line, naming the manifest key.
    """
    check_device(device, key=keys.device)
    factory = POLICIES.get(source) or _import_factory(source, search_path, keys)
    kwargs = dict(options or {})
    if "device" in kwargs:
        raise PolicyLoadError(f"{keys.options}.device: set the device with {keys.device}, not as a factory option")
    if _takes_device(factory):
        kwargs["device"] = device
    try:
        policy = factory(**kwargs)
    except PolicyLoadError:
        raise  # already one line saying what to fix
    except ConfigError as exc:
        # The factory converted its options with servo.config: the message starts at the option.
        raise PolicyLoadError(f"{keys.options}.{exc}") from None
    except (TypeError, ValueError) as exc:
        raise PolicyLoadError(f"{keys.options} do not fit {source!r}: {type(exc).__name__}: {exc}") from exc
    except Exception as exc:
        raise PolicyLoadError(f"{keys.source} {source!r} failed to build: {type(exc).__name__}: {exc}") from exc
    missing = [name for name in _REQUIRED if not hasattr(policy, name)]
    if missing:
        raise PolicyLoadError(
            f"{keys.source} {source!r} has no chunk API (missing {', '.join(missing)}); servo serves only "
            "policies that predict whole action chunks"
        )
    check_placement(policy, device, key=keys.device)
    return policy


def _import_factory(source: str, search_path: str | Path | None, keys: PolicyKeys) -> Callable[..., Policy]:
    module_name, sep, attr = source.partition(":")
    if not sep or not module_name or not attr:
        raise PolicyLoadError(
            f"{keys.source} {source!r} is neither a built-in ({', '.join(POLICIES)}) nor 'package.module:factory'"
        )
    where = str(Path(search_path).resolve()) if search_path is not None else None
    if where is not None and where not in sys.path:
        # Own policy modules usually sit next to their manifest.
        sys.path.append(where)
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        places = f"the manifest's directory ({where}) and " if where else ""
        raise PolicyLoadError(
            f"{keys.source} {source!r}: cannot import {module_name!r} ({exc}); looked in {places}the installed "
            "packages (is it installed, or on PYTHONPATH?)"
        ) from exc
    except Exception as exc:
        raise PolicyLoadError(
            f"{keys.source} {source!r}: importing {module_name!r} failed: {type(exc).__name__}: {exc}"
        ) from exc
    factory: Callable[..., Policy] | None = getattr(module, attr, None)
    if not callable(factory):
        raise PolicyLoadError(f"{keys.source} {source!r}: {module_name!r} has no callable {attr!r}")
    return factory


def _takes_device(factory: Callable[..., Any]) -> bool:
    try:
        parameters = inspect.signature(factory).parameters.values()
    except (TypeError, ValueError):
        return False
    return any(p.name == "device" or p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters)
