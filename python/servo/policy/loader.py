"""Policy sources: the explicit registry of built-ins, or any importable ``module:factory``."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any

from servo.policy.protocol import Policy


class PolicyLoadError(ValueError):
    """The policy source cannot be turned into a servable chunking policy."""


def _reference(**options: Any) -> Policy:
    from servo.policy.reference import make_reference_policy

    return make_reference_policy(**options)


#: Built-in policy sources. Adding an adapter = one entry here, never an import side effect.
POLICIES: dict[str, Callable[..., Policy]] = {"reference": _reference}

_REQUIRED = ("spec", "make_processor", "predict_chunk", "reset")


def load_policy(source: str, options: Mapping[str, Any] | None = None) -> Policy:
    """Instantiate a policy from a built-in name or ``package.module:factory``.

    Raises:
        PolicyLoadError: unknown source, import failure, bad options, or an object without the
            chunk API (``predict_chunk`` and friends) — such policies cannot be served.
    """
    factory = POLICIES.get(source)
    if factory is None:
        module_name, sep, attr = source.partition(":")
        if not sep or not module_name or not attr:
            raise PolicyLoadError(
                f"model.source {source!r} is neither a built-in ({', '.join(POLICIES)}) nor 'package.module:factory'"
            )
        try:
            factory = getattr(importlib.import_module(module_name), attr)
        except ImportError as exc:
            raise PolicyLoadError(f"model.source {source!r}: cannot import {module_name!r} ({exc})") from exc
        except AttributeError as exc:
            raise PolicyLoadError(f"model.source {source!r}: {module_name!r} has no {attr!r}") from exc
    try:
        policy = factory(**dict(options or {}))
    except TypeError as exc:
        raise PolicyLoadError(f"model.options do not fit {source!r}: {exc}") from exc
    missing = [name for name in _REQUIRED if not hasattr(policy, name)]
    if missing:
        raise PolicyLoadError(
            f"{source!r} has no chunk API (missing {', '.join(missing)}); servo serves only policies "
            "that predict whole action chunks"
        )
    return policy
