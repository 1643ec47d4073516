"""A small stand-in for the site's search: Material's lunr index, ranked the way lunr ranks it.

Material indexes each page section (title boosted 1000 times over text), splits on whitespace and
hyphens, drops English stop words and matches query terms as prefixes. This ranks the sections of
``search/search_index.json`` the same way (BM25 per field), so a test can ask what a reader typing
a question into the search box finds first.
"""

from __future__ import annotations

import html
import json
import math
import re
from dataclasses import dataclass
from pathlib import Path

#: lunr's English stop words that occur in the questions asked of the site.
STOP_WORDS = frozenset(
    {"a", "an", "and", "are", "as", "at", "be", "by", "can", "do", "does", "for", "from", "how", "i", "in", "into"}
    | {"is", "it", "my", "of", "on", "or", "the", "this", "to", "what", "when", "where", "which", "who", "why"}
    | {"will", "with"}
)
_TAG = re.compile(r"<[^>]+>")
_SPLIT = re.compile(r"[\s\-]+")


def tokens(text: str) -> list[str]:
    """Lower-case words of ``text`` (markup removed), without stop words or punctuation around them."""
    words = (w.strip(".,:;()[]{}'\"`!?*/|<>=") for w in _SPLIT.split(html.unescape(_TAG.sub(" ", text)).lower()))
    return [w for w in words if w and w not in STOP_WORDS]


@dataclass(frozen=True)
class Section:
    """One indexed section: its location (``guides/lerobot/#install``), title and words."""

    location: str
    title: list[str]
    text: list[str]

    @property
    def page(self) -> str:
        """The page the section is on (``guides/lerobot/``)."""
        return self.location.split("#")[0]


class SearchIndex:
    """The site's search index, loaded from ``site/search/search_index.json``."""

    def __init__(self, path: Path) -> None:
        docs = json.loads(path.read_text())["docs"]
        self.sections = [Section(d["location"], tokens(d["title"]), tokens(d["text"])) for d in docs]

    def search(self, query: str) -> list[Section]:
        """Sections holding every term of ``query`` (as a prefix of a word), best first."""
        terms = tokens(query)
        found = [s for s in self.sections if all(_count(t, s.title) + _count(t, s.text) for t in terms)]
        return sorted(found, key=lambda s: -self._score(terms, s))

    def _score(self, terms: list[str], section: Section) -> float:
        n = len(self.sections)
        avg_title = sum(len(s.title) for s in self.sections) / n or 1
        avg_text = sum(len(s.text) for s in self.sections) / n or 1
        score = 0.0
        for term in terms:
            df = sum(1 for s in self.sections if _count(term, s.title) or _count(term, s.text))
            idf = math.log(1 + (n - df + 0.5) / (df + 0.5))
            score += idf * (1000 * _bm25(_count(term, section.title), len(section.title), avg_title))
            score += idf * _bm25(_count(term, section.text), len(section.text), avg_text)
        return score


def _count(term: str, words: list[str]) -> int:
    return sum(1 for w in words if w.startswith(term))


def _bm25(tf: int, length: int, average: float, k1: float = 1.2, b: float = 0.75) -> float:
    return tf * (k1 + 1) / (tf + k1 * (1 - b + b * length / average)) if tf else 0.0
