"""JSON Schema to Python type expressions, and text made safe to embed in generated source.

Schemas, names and descriptions come from third-party servers, so nothing of theirs reaches the
generated source except through this module: type expressions come only from a fixed grammar
(builtins, ``Any``, ``Literal``, ``NotRequired``, ``TypedDict`` and the class names it invents),
literal values only through ``repr()``, and text only through :func:`docstring` and :func:`comment`.

The grammar covers what real servers emit (zod-to-json-schema and pydantic): ``type`` (or a list
of them), ``properties`` (a ``TypedDict``), ``items``, ``additionalProperties``, ``enum``,
``const``, ``anyOf``/``oneOf``, ``allOf`` with one member, ``$ref`` into ``$defs`` or
``definitions`` (a recursive reference becomes ``Any``) and OpenAPI's ``nullable``. Anything else
is ``Any``.
"""

from __future__ import annotations

import keyword
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = [
    "TypeDefs",
    "TypeRenderer",
    "class_name",
    "comment",
    "docstring",
    "is_plain_identifier",
    "json_scalar_source",
    "one_line",
]

_MAX_DEPTH = 8
_MAX_NAME = 80
_PRIMITIVES = {"string": "str", "integer": "int", "number": "float", "boolean": "bool", "null": "None"}
# Names a generated module binds or relies on: no invented class may take them.
_RESERVED = frozenset(
    {"Any", "Literal", "NotRequired", "TypedDict", "annotations", "str", "int", "float", "bool", "list", "dict"}
)
_WORD = re.compile(r"[0-9A-Za-z]+")
_SURROGATE = re.compile("[\ud800-\udfff]")


def is_plain_identifier(name: str) -> bool:
    """An ASCII identifier that is not a keyword (non-ASCII ones are NFKC-normalised by the parser)."""
    return name.isascii() and name.isidentifier() and not keyword.iskeyword(name)


def class_name(hint: str) -> str:
    """A CapWords identifier made from ``hint`` (``get_current_time`` -> ``GetCurrentTime``)."""
    name = "".join(word[0].upper() + word[1:] for word in _WORD.findall(hint))[:_MAX_NAME] or "Object"
    return f"T{name}" if name[0].isdigit() else name


def one_line(text: str, limit: int | None = None) -> str:
    """``text`` with all whitespace runs (newlines included) collapsed to one space, cut at ``limit``."""
    line = " ".join(text.split())
    if limit is not None and len(line) > limit:
        line = line[: limit - 1].rstrip() + "…"
    return line


def _escape_unprintable(text: str) -> str:
    return "".join(ch if ch.isprintable() or ch == "\n" else repr(ch)[1:-1] for ch in text)


def comment(text: str) -> str:
    """``text`` as one line that is safe after a ``#``: no line breaks, NULs or other controls."""
    return _escape_unprintable(one_line(text))


def docstring(text: str, indent: str = "") -> str:
    """A triple-quoted literal whose value is ``text`` (lines after the first indented by ``indent``).

    Lone surrogates become U+FFFD, backslashes are doubled, controls other than newline escaped,
    and every ``"`` that is followed by another ``"`` or ends the text is escaped, so no run of
    three quotes can close the literal.
    """
    text = _SURROGATE.sub("\ufffd", text)  # a class's __doc__ must encode as UTF-8
    text = _escape_unprintable(text.replace("\r\n", "\n").replace("\r", "\n").replace("\\", "\\\\"))
    out = ['\\"' if ch == '"' and (i + 1 == len(text) or text[i + 1] == '"') else ch for i, ch in enumerate(text)]
    first, *rest = "".join(out).split("\n")
    rest = [f"{indent}{line}" if line else "" for line in rest]
    if rest and not rest[-1]:
        rest[-1] = indent  # the closing quotes
    return '"""' + "\n".join([first, *rest]) + '"""'


def _literal_member(value: object) -> str | None:
    if value is None or isinstance(value, bool | str):
        return repr(value)
    if isinstance(value, int):
        return repr(value)
    return None  # floats, lists and objects cannot be Literal members


def json_scalar_source(value: object) -> str | None:
    """Python source for a JSON scalar (``repr``), or None for anything else (NaN and infinities too)."""
    if isinstance(value, float):
        return repr(value) if math.isfinite(value) else None
    return _literal_member(value)


@dataclass(frozen=True, slots=True)
class TypeDefs:
    """What a module needs for its type expressions: class sources in order, typing imports, class names."""

    definitions: tuple[str, ...] = ()
    typing_names: frozenset[str] = frozenset()
    class_names: tuple[str, ...] = ()


class TypeRenderer:
    """Turns the schemas of one tool into type expressions, collecting the classes they name."""

    def __init__(self, reserved: Iterable[str] = ()) -> None:
        self._taken = set(_RESERVED) | set(keyword.kwlist) | set(reserved)
        self._definitions: list[str] = []
        self._classes: list[str] = []
        self._typing: set[str] = set()
        self._refs: dict[tuple[int, str], str] = {}
        self._resolving: set[tuple[int, str]] = set()
        self._unions: dict[str, tuple[str, ...]] = {}  # unions made here, flattened when nested

    def defs(self) -> TypeDefs:
        return TypeDefs(tuple(self._definitions), frozenset(self._typing), tuple(self._classes))

    def claim(self, hint: str) -> str:
        """A class name for ``hint`` that nothing else in the module uses."""
        base = name = class_name(hint)
        counter = 2
        while name in self._taken:
            name, counter = f"{base}{counter}", counter + 1
        self._taken.add(name)
        return name

    def any(self) -> str:
        self._typing.add("Any")
        return "Any"

    def result(self, schema: Mapping[str, Any], name: str) -> str:
        """The type of a tool's structured result: a TypedDict called ``name`` where the schema is an object."""
        resolved = self._resolve(schema.get("$ref"), schema) if isinstance(schema.get("$ref"), str) else schema
        if isinstance(resolved, Mapping) and _properties(resolved):
            return self._typed_dict(resolved, name, schema, 0)
        return self.annotation(schema, name, schema)

    def annotation(self, schema: object, hint: str, root: Mapping[str, Any], depth: int = 0) -> str:
        """The type expression for ``schema``; ``root`` holds its ``$defs``; ``hint`` names new classes."""
        if depth > _MAX_DEPTH or not isinstance(schema, Mapping):
            return self.any()
        expr = self._annotation(schema, hint, root, depth)
        return self.union([expr, "None"]) if schema.get("nullable") is True else expr

    def _annotation(self, schema: Mapping[str, Any], hint: str, root: Mapping[str, Any], depth: int) -> str:
        ref = schema.get("$ref")
        if isinstance(ref, str):
            return self._ref(ref, root, depth)
        choices = [schema["const"]] if "const" in schema else schema.get("enum")
        if isinstance(choices, list) and choices:
            members = [_literal_member(value) for value in choices]
            if all(member is not None for member in members):
                self._typing.add("Literal")
                return f"Literal[{', '.join(m for m in members if m is not None)}]"
        for key in ("anyOf", "oneOf"):
            options = schema.get(key)
            if isinstance(options, list) and options:
                return self.union([self.annotation(option, hint, root, depth + 1) for option in options])
        all_of = schema.get("allOf")
        if isinstance(all_of, list):
            return self.annotation(all_of[0], hint, root, depth + 1) if len(all_of) == 1 else self.any()
        kind = schema.get("type")
        if kind is None:
            kind = "object" if "properties" in schema else "array" if "items" in schema else None
        if isinstance(kind, list):
            kinds = [k for k in kind if isinstance(k, str)]
            return self.union([self._typed(k, schema, hint, root, depth) for k in kinds]) if kinds else self.any()
        return self._typed(kind, schema, hint, root, depth) if isinstance(kind, str) else self.any()

    def _typed(self, kind: str, schema: Mapping[str, Any], hint: str, root: Mapping[str, Any], depth: int) -> str:
        if kind in _PRIMITIVES:
            return _PRIMITIVES[kind]
        if kind == "array":
            return f"list[{self.annotation(schema.get('items'), f'{hint}Item', root, depth + 1)}]"
        if kind == "object":
            if _properties(schema):
                return self._typed_dict(schema, self.claim(hint), root, depth)
            extra = schema.get("additionalProperties")
            value = self.annotation(extra, f"{hint}Value", root, depth + 1) if isinstance(extra, Mapping) else None
            return f"dict[str, {value or self.any()}]"
        return self.any()

    def union(self, exprs: Sequence[str]) -> str:
        """``A | B`` without repeats, ``None`` last; ``Any`` absorbs the rest."""
        members = list(dict.fromkeys(member for expr in exprs for member in self._unions.get(expr, (expr,))))
        if "Any" in members:
            return self.any()
        members.sort(key=lambda member: member == "None")
        union = " | ".join(members)
        self._unions[union] = tuple(members)
        return union

    def _ref(self, ref: str, root: Mapping[str, Any], depth: int) -> str:
        key = (id(root), ref)
        if key in self._refs:
            return self._refs[key]
        target = self._resolve(ref, root)
        if target is None or key in self._resolving:
            return self.any()  # unknown, external or recursive
        self._resolving.add(key)
        try:
            expr = self.annotation(target, ref.rsplit("/", 1)[-1], root, depth + 1)
        finally:
            self._resolving.discard(key)
        self._refs[key] = expr
        return expr

    @staticmethod
    def _resolve(ref: object, root: Mapping[str, Any]) -> Mapping[str, Any] | None:
        match = re.fullmatch(r"#/(\$defs|definitions)/([^/]+)", ref) if isinstance(ref, str) else None
        if match is None:
            return None
        defs = root.get(match[1])
        name = match[2].replace("~1", "/").replace("~0", "~")
        target = defs.get(name) if isinstance(defs, Mapping) else None
        return target if isinstance(target, Mapping) else None

    def _typed_dict(self, schema: Mapping[str, Any], name: str, root: Mapping[str, Any], depth: int) -> str:
        required = schema.get("required")
        required_keys = {key for key in required if isinstance(key, str)} if isinstance(required, list) else set()
        fields: list[tuple[str, str, bool, str]] = []
        for key, sub in _properties(schema).items():
            expr = self.annotation(sub, f"{name}{class_name(key)}", root, depth + 1)
            fields.append((key, expr, key in required_keys, _description(sub)))
        self._typing.add("TypedDict")
        description = _description(schema)
        # Class syntax only where it is exact: under postponed annotations a mixed class's
        # NotRequired keys would count as required at runtime (CPython 3.11 reads strings there).
        plain = all(is_plain_identifier(key) and not key.startswith("__") for key, *_ in fields)
        if plain and len({is_required for _, _, is_required, _ in fields}) == 1:
            lines = [f"class {name}(TypedDict{'' if fields[0][2] else ', total=False'}):"]
            if description:
                lines.append(f"    {docstring(description, '    ')}")
            lines.extend(f"    {key}: {expr}{_trailing(text)}" for key, expr, _, text in fields)
        else:
            if any(not is_required for _, _, is_required, _ in fields):
                self._typing.add("NotRequired")
            lines = [f"# {comment(description)}"] if description else []
            lines += [f"{name} = TypedDict(", f"    {name!r},", "    {"]
            for key, expr, is_required, text in fields:
                value = expr if is_required else f"NotRequired[{expr}]"
                lines.append(f"        {key!r}: {value},{_trailing(text)}")
            lines += ["    },", ")"]
        self._definitions.append("\n".join(lines))
        self._classes.append(name)
        return name


def _properties(schema: Mapping[str, Any]) -> Mapping[str, Any]:
    properties = schema.get("properties")
    return properties if isinstance(properties, Mapping) else {}


def _description(schema: object) -> str:
    text = schema.get("description") if isinstance(schema, Mapping) else None
    return text if isinstance(text, str) else ""


def _trailing(text: str) -> str:
    return f"  # {comment(text)}" if text.strip() else ""
