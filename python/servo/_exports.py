"""A package's public names, imported when first used (PEP 562).

``import servo`` must stay instant and light: the control process, every command-line tool and
every child process imports the ``servo`` package, and none of them may pay for the server, the
client or Zenoh it does not use. A package lists its public names once, by the module that owns
each; the first ``servo.PolicyClient`` (or ``from servo import PolicyClient``) imports
``servo.client`` and caches the name. Type checkers read the same names from the package's
``if TYPE_CHECKING:`` imports (a test keeps the two equal).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def lazy_exports(
    package: str, owners: Mapping[str, tuple[str, ...]], namespace: dict[str, Any]
) -> tuple[list[str], Callable[[str], Any], Callable[[], list[str]]]:
    """``__all__``, ``__getattr__`` and ``__dir__`` of ``package``.

    Args:
        package: The package's ``__name__`` (named in errors).
        owners: Owning module -> the public names it defines (or re-exports).
        namespace: The package's ``globals()``: a name, once imported, is cached there.
    """
    where = {name: module for module, names in owners.items() for name in names}

    def __getattr__(name: str) -> Any:
        module = where.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted({*namespace, *where})

    return sorted(where), __getattr__, __dir__
