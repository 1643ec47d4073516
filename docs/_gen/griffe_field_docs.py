"""A griffe extension: a configuration field's ``doc("…")`` is its docstring in the API reference.

servo documents each field of a msgspec Struct once, in its annotation
(``Annotated[Seconds, doc("Staleness bound (s).")]``, or ``msgspec.Meta(description=…)``), which is
also what ``--help`` and the configuration reference show. Without this extension the API reference
would list those fields as undocumented.
"""

from __future__ import annotations

import ast
from typing import Any

import griffe


class FieldDocs(griffe.Extension):
    """Sets the docstring of an attribute annotated with a description, when it has none."""

    def on_attribute_instance(self, *, node: ast.AST | griffe.ObjectNode, attr: griffe.Attribute, **_: Any) -> None:
        """Take the description out of the annotation (static analysis only)."""
        if attr.docstring is not None or not isinstance(node, ast.AnnAssign):
            return
        text = _description(node.annotation)
        if text:
            attr.docstring = griffe.Docstring(text, parent=attr)


def _description(annotation: ast.expr) -> str | None:
    """The string given to ``doc(…)`` or as ``description=`` anywhere in ``Annotated[…]``."""
    if not (isinstance(annotation, ast.Subscript) and _name(annotation.value) == "Annotated"):
        return None
    for call in ast.walk(annotation.slice):
        if not isinstance(call, ast.Call):
            continue
        if _name(call.func) == "doc" and call.args and isinstance(first := call.args[0], ast.Constant):
            return str(first.value)
        for keyword in call.keywords:
            if keyword.arg == "description" and isinstance(keyword.value, ast.Constant):
                return str(keyword.value.value)
    return None


def _name(node: ast.expr) -> str:
    return node.attr if isinstance(node, ast.Attribute) else node.id if isinstance(node, ast.Name) else ""
