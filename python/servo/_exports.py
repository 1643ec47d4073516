"""A package's public names, imported when first used (PEP 562).

``import servo`` must stay instant and light: the control process, every command-line tool and
every child process imports the ``servo`` package, and none of them may pay for the server, the
client or Zenoh it does not use. A package lists each public name once, in its
``if TYPE_CHECKING:`` block, as ``from owner import Name as Name``: type checkers and IDEs read
those imports, and at run time `lazy_exports` reads the same lines from the package's source, so
the first ``servo.PolicyClient`` (or ``from servo import PolicyClient``) imports ``servo.client``
and caches the name.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any


def public_names(source: str) -> dict[str, str]:
    """Public name -> owning module, from the ``from owner import Name as Name`` lines of ``source``.

    Only lines indented once count (the package's ``if TYPE_CHECKING:`` block); a plain string
    split keeps ``import servo`` from importing ``re`` or ``ast``.
    """
    where = {}
    for line in source.splitlines():
        words = line.split()
        if (
            line.startswith("    from ")
            and len(words) == 6
            and words[2::2] == ["import", "as"]
            and words[3] == words[5]
        ):
            where[words[3]] = words[1]
    return where


def lazy_exports(namespace: dict[str, Any]) -> tuple[list[str], Callable[[str], Any], Callable[[], list[str]]]:
    """``__all__``, ``__getattr__`` and ``__dir__`` of the package whose ``globals()`` is ``namespace``.

    Its public names are the ``from owner import Name as Name`` lines of its ``if TYPE_CHECKING:``
    block (`public_names`); a name, once imported, is cached in ``namespace``.
    """
    package = namespace["__name__"]
    with open(namespace["__file__"], encoding="utf-8") as f:
        where = public_names(f.read())

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
