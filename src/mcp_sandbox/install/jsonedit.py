"""Set one member of a JSON (or JSONC) file by editing its text, leaving the rest as it was.

Re-serialising a client's config would reflow it and drop VS Code's comments. Instead the text
is parsed into spans (:func:`parse`), and :func:`set_member` replaces the one value's span, or
inserts one member after the last of its object, indented like its siblings. Comments, trailing
commas, key order, blank lines and every other entry stay byte for byte. The result is parsed
again and checked to hold the new value and nothing else changed; if not, nothing is written.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

__all__ = ["JsonEditError", "dump", "load", "set_member"]


class JsonEditError(ValueError):
    """The text is not JSON (with comments) of the expected shape; the message says where."""


_TOKEN = re.compile(
    r"""(?P<ws>[ \t\r\n\ufeff]+)
      | (?P<comment>//[^\n]*|/\*.*?\*/)
      | (?P<string>"(?:[^"\\\x00-\x1f]|\\.)*")
      | (?P<number>-?(?:0|[1-9]\d*)(?:\.\d+)?(?:[eE][+-]?\d+)?)
      | (?P<literal>true|false|null)
      | (?P<punct>[{}\[\]:,])""",
    re.VERBOSE | re.DOTALL,
)


@dataclass
class Node:
    """A value's span in the text, its Python value, and for an object its members by key."""

    start: int
    end: int
    value: Any = None
    members: list[tuple[str, int, Node]] = field(default_factory=list)  # (key, key start, value)
    is_object: bool = False
    trailing_comma: int | None = None  # position of a comma after the last member


class _Parser:
    def __init__(self, text: str) -> None:
        self.text = text
        self.tokens: list[tuple[str, str, int]] = []
        pos = 0
        while pos < len(text):
            match = _TOKEN.match(text, pos)
            if match is None:
                self.fail(pos, "unexpected character")
            assert match is not None and match.lastgroup is not None
            if match.lastgroup not in ("ws", "comment"):
                self.tokens.append((match.lastgroup, match.group(), pos))
            pos = match.end()
        self.index = 0

    def fail(self, pos: int, message: str) -> None:
        line = self.text.count("\n", 0, pos) + 1
        column = pos - (self.text.rfind("\n", 0, pos) + 1) + 1
        raise JsonEditError(f"invalid JSON at line {line}, column {column}: {message}")

    def peek(self) -> tuple[str, str, int]:
        if self.index >= len(self.tokens):
            self.fail(len(self.text), "unexpected end")
        return self.tokens[self.index]

    def take(self, expected: str | None = None) -> tuple[str, str, int]:
        token = self.peek()
        if expected is not None and token[1] != expected:
            self.fail(token[2], f"expected {expected!r}")
        self.index += 1
        return token

    def value(self) -> Node:
        kind, text, pos = self.take()
        if kind in ("string", "number", "literal"):
            return Node(pos, pos + len(text), json.loads(text))
        if text == "{":
            return self.object(pos)
        if text == "[":
            return self.array(pos)
        self.fail(pos, f"unexpected {text!r}")
        raise AssertionError  # unreachable: fail raises

    def object(self, start: int) -> Node:
        node = Node(start, start, {}, is_object=True)
        while self.peek()[1] != "}":
            kind, text, pos = self.take()
            if kind != "string":
                self.fail(pos, "expected a key")
            self.take(":")
            child = self.value()
            key = json.loads(text)
            node.members.append((key, pos, child))
            node.value[key] = child.value
            if self.peek()[1] == ",":
                comma = self.take()[2]
                if self.peek()[1] == "}":
                    node.trailing_comma = comma
            elif self.peek()[1] != "}":
                self.fail(self.peek()[2], "expected ',' or '}'")
        node.end = self.take("}")[2] + 1
        return node

    def array(self, start: int) -> Node:
        items: list[Any] = []
        while self.peek()[1] != "]":
            items.append(self.value().value)
            if self.peek()[1] == ",":
                self.take()
            elif self.peek()[1] != "]":
                self.fail(self.peek()[2], "expected ',' or ']'")
        return Node(start, self.take("]")[2] + 1, items)


def parse(text: str) -> Node:
    """The span tree of ``text`` (JSON with comments and trailing commas)."""
    parser = _Parser(text)
    root = parser.value()
    if parser.index != len(parser.tokens):
        parser.fail(parser.tokens[parser.index][2], "unexpected text after the value")
    return root


def load(text: str) -> Any:
    """The Python value of ``text`` (JSON with comments and trailing commas)."""
    return parse(text).value


def _line_indent(text: str, pos: int) -> str:
    line_start = text.rfind("\n", 0, pos) + 1
    return re.match(r"[ \t]*", text[line_start:]).group()  # type: ignore[union-attr]


def _starts_line(text: str, pos: int) -> bool:
    return text[text.rfind("\n", 0, pos) + 1 : pos].strip() == ""


def _indent_unit(text: str, root: Node) -> str:
    for _, key_pos, _ in root.members:
        if _starts_line(text, key_pos):
            return _line_indent(text, key_pos) or "  "
    return "  "


def _dump(value: Any, unit: str | None, indent: str) -> str:
    """``value`` as JSON: on one line (``unit`` None), else indented by ``unit`` from ``indent``,
    with short lists of scalars (``"args": ["serve"]``) kept on one line as people write them."""
    one_line = json.dumps(value, ensure_ascii=False, separators=(", ", ": "))
    if unit is None:
        return one_line
    inner = indent + unit
    if isinstance(value, dict) and value:
        members = [
            f"{inner}{json.dumps(key, ensure_ascii=False)}: {_dump(item, unit, inner)}" for key, item in value.items()
        ]
        return "{\n" + ",\n".join(members) + f"\n{indent}}}"
    if isinstance(value, list) and value:
        if all(not isinstance(item, dict | list) for item in value) and len(one_line) <= 72:
            return one_line
        return "[\n" + ",\n".join(f"{inner}{_dump(item, unit, inner)}" for item in value) + f"\n{indent}]"
    return one_line


def _insert(text: str, obj: Node, key: str, value: Any, unit: str) -> str:
    """``text`` with ``"key": value`` added as the last member of ``obj``."""
    if not obj.members:
        outer = _line_indent(text, obj.start)
        inner = outer + unit
        body = text[obj.start + 1 : obj.end - 1]
        member = f"{json.dumps(key)}: {_dump(value, unit, inner)}"
        if body.strip() == "":
            return f"{text[: obj.start + 1]}\n{inner}{member}\n{outer}{text[obj.end - 1 :]}"
        return f"{text[: obj.start + 1]}\n{inner}{member}{text[obj.start + 1 :]}"  # before the comments
    _, last_key, last = obj.members[-1]
    if not _starts_line(text, last_key):
        # Members on one line: continue the line.
        at = obj.trailing_comma + 1 if obj.trailing_comma is not None else last.end
        sep = " " if obj.trailing_comma is not None else ", "
        return f"{text[:at]}{sep}{json.dumps(key)}: {_dump(value, None, '')}{text[at:]}"
    indent = _line_indent(text, last_key)
    member = f"{json.dumps(key)}: {_dump(value, unit, indent)}"
    if obj.trailing_comma is not None:
        head, at, tail = text[: obj.trailing_comma + 1], obj.trailing_comma + 1, ","
    else:
        head, at, tail = text[: last.end] + ",", last.end, ""
    # A comment closing the last member's line stays on that line.
    line_end = text.find("\n", at)
    line_end = len(text) if line_end < 0 else line_end
    rest = text[at:line_end]
    if rest.strip().startswith("//") or (rest.strip().startswith("/*") and rest.strip().endswith("*/")):
        return f"{head}{rest}\n{indent}{member}{tail}{text[line_end:]}"
    return f"{head}\n{indent}{member}{tail}{text[at:]}"


def dump(value: Any) -> str:
    """``value`` as a new file would hold it: two-space indents, short lists on one line."""
    return _dump(value, "  ", "")


def set_member(text: str, path: tuple[str, ...], value: Any) -> str:
    """``text`` with the member at ``path`` (keys from the top-level object) set to ``value``.

    Objects missing on the way are created. Raises JsonEditError when the text is not JSON(C),
    or a value on the way is not an object.
    """
    if not text.strip():
        text = "{}\n"
    root = parse(text)
    if not root.is_object:
        raise JsonEditError("the file's top-level value is not an object")
    unit = _indent_unit(text, root)
    node = root
    for depth, key in enumerate(path):
        found = [child for name, _, child in node.members if name == key]
        if not found:
            nested: Any = value
            for outer_key in reversed(path[depth + 1 :]):
                nested = {outer_key: nested}
            edited = _insert(text, node, key, nested, unit)
            break
        child = found[-1]  # JSON: the last of duplicate keys wins
        if depth == len(path) - 1:
            indent = _line_indent(text, child.start)
            one_line = not _starts_line(text, next(pos for name, pos, c in node.members if c is child))
            edited = text[: child.start] + _dump(value, None if one_line else unit, indent) + text[child.end :]
            break
        if not child.is_object:
            raise JsonEditError(f"{'.'.join(path[: depth + 1])} is not an object")
        node = child
    _check(text, edited, path, value)
    return edited


def _check(before: str, after: str, path: tuple[str, ...], value: Any) -> None:
    """The edit set exactly the one member: anything else would be a bug here, never written."""
    expected = load(before)
    target = expected
    for key in path[:-1]:
        target = target.setdefault(key, {})
    target[path[-1]] = value
    if load(after) != expected:
        raise JsonEditError("internal error: the edit changed more than the one entry; nothing written")
