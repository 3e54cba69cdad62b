"""Ranked search over every downstream tool: BM25 over names, descriptions and parameters.

Written here rather than taken from a library: BM25 is a few dozen lines, and the index is small
(hundreds of tools) and rebuilt whenever a server's tool list changes.

A tool's text is tokenised field by field: its name, server, title and description, its
parameters' names and descriptions (nested ones too) and, weighted less, those of its result.
Names split at ``snake_case``, ``kebab-case``, dots, ``camelCase`` and digits; everything is
lowercased, stopwords dropped and plurals folded. Each field's tokens count with a weight, so a
word in the tool's name outweighs the same word in its description.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Collection, Iterable, Iterator, Mapping
from typing import Any, Literal

from mcp_sandbox.bridge.stubs import ToolDoc, render_tool_module

__all__ = ["DETAILS", "MAX_SEARCH_RESULTS", "Detail", "ToolIndex", "render", "tokenize"]

Detail = Literal["name", "summary", "full"]
DETAILS: tuple[Detail, ...] = ("name", "summary", "full")
# The most results one search returns, whether the model or sandboxed code asks.
MAX_SEARCH_RESULTS = 100

_K1 = 1.2
_B = 0.75
_NAME_WEIGHT = 3.0
_TITLE_WEIGHT = 2.0
_PARAM_NAME_WEIGHT = 1.0
_TEXT_WEIGHT = 1.0
_SERVER_WEIGHT = 1.0
_RESULT_WEIGHT = 0.5
_MAX_SCHEMA_DEPTH = 4
_STOPWORDS = frozenset(
    "a an and are as at be by can do does for from how i if in into is it its me my not of on or "
    "that the their them then there these this to use used using via was what when which will with you your".split()
)
_CHUNK = re.compile(r"[^\W_]+")
_PART = re.compile(r"[A-Z]+(?![a-z])|[A-Z]?[a-z]+|[0-9]+|[^\W\d_A-Za-z]+")


def tokenize(text: str) -> list[str]:
    """Lowercased words of ``text``, camelCase and digits split off, stopwords dropped, plurals folded."""
    tokens = []
    for chunk in _CHUNK.findall(text):
        for part in _PART.findall(chunk) if chunk.isascii() else [chunk]:
            token = _fold(part.lower())
            if token not in _STOPWORDS and (len(token) > 1 or token.isdigit()):
                tokens.append(token)
    return tokens


def _fold(word: str) -> str:
    # Just enough stemming that "entities" finds "entity" and "files" finds "file".
    if len(word) > 4 and word.endswith("ies"):
        return f"{word[:-3]}y"
    if len(word) > 3 and word.endswith("s") and not word.endswith(("ss", "us", "is")):
        return word[:-1]
    return word


def _schema_text(schema: object, depth: int = 0) -> Iterator[tuple[str, str]]:
    """(property name, description) pairs of a schema's nested properties."""
    if depth > _MAX_SCHEMA_DEPTH or not isinstance(schema, Mapping):
        return
    properties = schema.get("properties")
    for name, sub in properties.items() if isinstance(properties, Mapping) else ():
        text = sub.get("description") if isinstance(sub, Mapping) else None
        yield name, text if isinstance(text, str) else ""
        yield from _schema_text(sub, depth + 1)
    for key in ("items", "additionalProperties"):
        yield from _schema_text(schema.get(key), depth + 1)
    for key in ("anyOf", "oneOf", "allOf"):
        members = schema.get(key)
        for member in members if isinstance(members, list) else ():
            yield from _schema_text(member, depth + 1)
    defs: Any = schema.get("$defs") if depth == 0 else None
    for sub in defs.values() if isinstance(defs, Mapping) else ():
        yield from _schema_text(sub, depth + 1)


def _weighted_terms(doc: ToolDoc) -> dict[str, float]:
    terms: dict[str, float] = {}
    fields = [
        (doc.python_name if doc.python_name == doc.name else f"{doc.name} {doc.python_name}", _NAME_WEIGHT),
        (doc.server, _SERVER_WEIGHT),
        (doc.title or "", _TITLE_WEIGHT),
        (doc.description, _TEXT_WEIGHT),
    ]
    for name, text in _schema_text(doc.input_schema):
        fields += [(name, _PARAM_NAME_WEIGHT), (text, _TEXT_WEIGHT)]
    for name, text in _schema_text(doc.output_schema):  # what it returns: "weather" finds a forecast
        fields += [(name, _RESULT_WEIGHT), (text, _RESULT_WEIGHT)]
    for text, weight in fields:
        for token in tokenize(text):
            terms[token] = terms.get(token, 0.0) + weight
    return terms


class ToolIndex:
    """BM25 (k1 = 1.2, b = 0.75) over tools, each a bag of weighted field tokens."""

    def __init__(self, docs: Iterable[ToolDoc]) -> None:
        self._docs = list(docs)
        self._terms = [_weighted_terms(doc) for doc in self._docs]
        self._lengths = [sum(terms.values()) for terms in self._terms]
        self._average = (sum(self._lengths) / len(self._lengths) if self._lengths else 0.0) or 1.0
        frequency: Counter[str] = Counter(token for terms in self._terms for token in terms)
        count = len(self._docs)
        self._idf = {token: math.log(1 + (count - df + 0.5) / (df + 0.5)) for token, df in frequency.items()}

    def search(
        self, query: str, *, limit: int = 10, servers: Collection[str] | None = None
    ) -> list[tuple[ToolDoc, float]]:
        """The tools best matching ``query``, best first (ties by server, then name); [] for none."""
        tokens = [token for token in dict.fromkeys(tokenize(query)) if token in self._idf]
        if not tokens or limit <= 0:
            return []
        hits: list[tuple[ToolDoc, float]] = []
        for doc, terms, length in zip(self._docs, self._terms, self._lengths, strict=True):
            if servers is not None and doc.server not in servers:
                continue
            norm = _K1 * (1 - _B + _B * length / self._average)
            score = sum(self._idf[t] * terms[t] * (_K1 + 1) / (terms[t] + norm) for t in tokens if t in terms)
            if score > 0:
                hits.append((doc, score))
        hits.sort(key=lambda hit: (-hit[1], hit[0].server, hit[0].name))
        return hits[:limit]


def render(doc: ToolDoc, detail: Detail) -> str:
    """One tool at a level of detail: ``name`` (alias.tool), ``summary`` (signature, summary), ``full`` (its stub).

    Raises:
        ValueError: ``detail`` is not one of :data:`DETAILS`.
    """
    if detail == "name":
        return f"{doc.server}.{doc.python_name}"
    if detail == "summary":
        summary = f" — {doc.summary}" if doc.summary else ""
        return f"{doc.server}.{doc.signature()}{summary}"
    if detail == "full":
        return render_tool_module(doc)
    raise ValueError(f"detail must be one of {DETAILS}, not {detail!r}")
