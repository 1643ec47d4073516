"""The API reference: the ``servo`` namespace and the public names of each subpackage, from the docstrings.

The names come from the code at build time: ``servo.__all__`` (the one namespace applications
use) and the ``__all__`` of every subpackage or module that declares one. Each owning module gets
a page of mkdocstrings directives, one per public name, and the index lists every ``servo.X`` with
the first line of its docstring and a link to its entry. Nothing here lists a name by hand.
"""

from __future__ import annotations

import dataclasses
import importlib
from pathlib import Path

import griffe
from markdown_text import cell

PACKAGE = "servo"
#: Subpackages that are tools, not an API (their reference is the CLI page).
_NOT_API = {"servo.cli"}


@dataclasses.dataclass(frozen=True)
class Entry:
    """One public name: where applications reach it and where it is documented."""

    name: str  # as exported: "PolicyServer"
    owner: str  # the module whose page documents it: "servo.server"
    summary: str  # first line of its docstring
    top_level: bool  # also servo.<name>

    @property
    def path(self) -> str:
        """The documented path, ``servo.server.PolicyServer``."""
        return f"{self.owner}.{self.name}"


@dataclasses.dataclass(frozen=True)
class Api:
    """The public names, and the first docstring line of each module that owns some."""

    entries: list[Entry]
    modules: dict[str, str]


def collect(source: Path) -> Api:
    """Every public name, by owning module (``servo.__all__`` first, then the modules' own)."""
    tree = griffe.load(PACKAGE, search_paths=[str(source)], resolve_aliases=True, resolve_external=False)
    found: dict[str, Entry] = {}
    for name in importlib.import_module(PACKAGE).__all__:
        if name.startswith("_"):
            continue
        alias = tree[name]
        owner = alias.target_path.rsplit(".", 1)[0] if alias.is_alias else PACKAGE
        found[f"{owner}.{name}"] = Entry(name, owner, _summary(tree, name), top_level=True)
    for module in _public_modules(tree):
        for name in importlib.import_module(module).__all__:
            relative = f"{_relative(module)}.{name}"
            found.setdefault(f"{module}.{name}", Entry(name, module, _summary(tree, relative), top_level=False))
    entries = sorted(found.values(), key=lambda e: (e.owner, not e.top_level, e.name.lower()))
    owners = {e.owner for e in entries}
    return Api(entries, {owner: _summary(tree, _relative(owner)) for owner in sorted(owners)})


def _relative(path: str) -> str:
    return path.removeprefix(PACKAGE + ".")


def _public_modules(tree: griffe.Module) -> list[str]:
    """The subpackages and modules of ``servo`` that declare a public API (an ``__all__``)."""
    return sorted(
        module.path
        for module in tree.modules.values()
        if not module.name.startswith("_")
        and module.path not in _NOT_API
        and hasattr(importlib.import_module(module.path), "__all__")
    )


def _summary(tree: griffe.Module, path: str) -> str:
    """The first line of the docstring of ``tree[path]``; empty if it has none or cannot be found."""
    try:
        docstring = tree[path].docstring
    except (KeyError, griffe.AliasResolutionError):
        return ""
    return docstring.value.strip().splitlines()[0] if docstring else ""


def pages(api: Api) -> dict[str, str]:
    """Page path (under ``reference/api/``) -> Markdown: the index and one page per owning module."""
    out = {"index.md": _index(api)}
    for owner in api.modules:
        lines = [
            f"# {owner}",
            "",
            f"::: {owner}",
            "    options:",
            "      members: false",
            "      show_root_heading: false",
        ]
        for entry in (e for e in api.entries if e.owner == owner):
            lines += ["", f"::: {entry.path}", "    options:", "      heading_level: 2"]
            if not entry.summary:  # a public name is listed even without a docstring of its own
                lines.append("      show_if_no_docstring: true")
        out[f"{owner}.md"] = "\n".join(lines) + "\n"
    return out


def _index(api: Api) -> str:
    lines = [
        "# API reference",
        "",
        "Everything an application uses is `servo.X`: `import servo` loads none of it until a name is "
        "first used (so it stays instant and never imports torch). Each name is documented in the module "
        "that defines it, below; those modules' other public names serve their own users (robot drivers, "
        "policy adapters, tools). Generated from the docstrings when the site is built.",
        "",
        "## The `servo` namespace",
        "",
        "| name | what it is |",
        "|---|---|",
    ]
    for entry in sorted((e for e in api.entries if e.top_level), key=lambda e: e.name.lower()):
        lines.append(f"| [`servo.{entry.name}`][{entry.path}] | {cell(entry.summary)} |")
    lines += ["", "## Modules", ""]
    lines += [f"- [`{owner}`]({owner}.md): {cell(summary)}" for owner, summary in api.modules.items()]
    return "\n".join(lines) + "\n"
