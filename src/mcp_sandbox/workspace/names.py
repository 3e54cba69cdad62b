"""What a file name in a workspace, and a conversation id, may be.

A file name is a relative POSIX path below the conversation's directory (``plots/a.png``). The
rules keep every accepted name inside the directory, printable in logs and headers, and out of
the reserved namespace the host uses for its own temporary files.
"""

from __future__ import annotations

from mcp_sandbox.errors import ValidationError

__all__ = [
    "MAX_COMPONENTS",
    "MAX_COMPONENT_BYTES",
    "MAX_CONVERSATION_ID_CHARS",
    "MAX_NAME_BYTES",
    "RESERVED_PREFIX",
    "check_conversation_id",
    "check_filename",
]

# The host's own temporary names (uploads in progress, removal.py's moved directories) start
# with this; clients may not name a file into it.
RESERVED_PREFIX = ".mcp-sandbox-"
MAX_COMPONENT_BYTES = 255  # NAME_MAX
MAX_NAME_BYTES = 1024
MAX_COMPONENTS = 16
MAX_CONVERSATION_ID_CHARS = 256


def _control_character(text: str) -> str | None:
    for char in text:
        if ord(char) < 0x20 or ord(char) == 0x7F:
            return f"U+{ord(char):04X}"
    return None


def check_filename(name: object, argument: str = "filename") -> str:
    """Return ``name`` if it is an acceptable relative path inside a workspace.

    Raises:
        ValidationError: (naming ``argument``) the name is not a string, empty, absolute, has
            ``.``, ``..`` or empty components, a backslash, NUL or another control character,
            is not encodable as UTF-8, has a component over 255 bytes, is over 1024 bytes or 16
            components, or has a component in the reserved ``.mcp-sandbox-`` namespace.
    """
    if not isinstance(name, str):
        raise ValidationError(argument, "must be a string")
    if not name:
        raise ValidationError(argument, "must not be empty")
    control = _control_character(name)
    if control is not None:
        raise ValidationError(argument, f"must not contain control characters ({control})")
    if "\\" in name:
        raise ValidationError(argument, "must use / between directories, not \\")
    if name.startswith("/"):
        raise ValidationError(argument, "must be a path relative to the workspace, not absolute")
    try:
        encoded = name.encode("utf-8")
    except UnicodeEncodeError as exc:  # lone surrogates, e.g. from undecodable bytes
        raise ValidationError(argument, "must be valid UTF-8") from exc
    if len(encoded) > MAX_NAME_BYTES:
        raise ValidationError(argument, f"must be at most {MAX_NAME_BYTES} bytes")
    components = name.split("/")
    if len(components) > MAX_COMPONENTS:
        raise ValidationError(argument, f"must have at most {MAX_COMPONENTS} path components")
    for component in components:
        if component in ("", ".", ".."):
            raise ValidationError(argument, "must not have empty, '.' or '..' path components")
        if len(component.encode("utf-8")) > MAX_COMPONENT_BYTES:
            raise ValidationError(argument, f"each path component must be at most {MAX_COMPONENT_BYTES} bytes")
        if component.startswith(RESERVED_PREFIX):
            raise ValidationError(argument, f"names starting with {RESERVED_PREFIX!r} are reserved")
    return name


def check_conversation_id(value: object) -> str:
    """Return ``value`` if it is an acceptable conversation id: 1 to 256 printable characters.

    Raises:
        ValidationError: (``conversationId``) not a string, empty, too long, or with a control
            character.
    """
    if not isinstance(value, str):
        raise ValidationError("conversationId", "must be a string")
    if not 1 <= len(value) <= MAX_CONVERSATION_ID_CHARS:
        raise ValidationError("conversationId", f"must be 1 to {MAX_CONVERSATION_ID_CHARS} characters")
    control = _control_character(value)
    if control is not None:
        raise ValidationError("conversationId", f"must not contain control characters ({control})")
    return value
