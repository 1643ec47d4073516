"""Docstring and help text as Markdown: reST inline markup, and text that must fit one table cell."""

from __future__ import annotations

import re

#: A code span (what a table cell may hold a pipe in) or a lone pipe (which would end the cell).
_CODE_OR_PIPE = re.compile(r"(`+)(.+?)\1|\|")


def from_rest(text: str) -> str:
    """``text`` with reST's ````literal```` written as Markdown's `literal` (a `ref` is already code)."""
    return re.sub(r"``([^`]+)``", r"`\1`", text.strip())


def cell(text: str) -> str:
    """``text`` on one line, its pipes escaped outside code spans."""
    text = from_rest(text).replace("\n", " ")
    return _CODE_OR_PIPE.sub(lambda m: m.group(0) if m.group(1) else "\\|", text)
