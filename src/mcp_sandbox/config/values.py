"""Setting values as people write them: sizes (``512m``), durations (``10m``), booleans, lists.

:func:`coerce` turns a string (environment, flag) or a TOML value into the type of the
:class:`~mcp_sandbox.config.settings.Settings` field it is for, in the unit the field declares.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from mcp_sandbox.config.fields import BYTES, DURATION
from mcp_sandbox.config.settings import SETTINGS
from mcp_sandbox.errors import ConfigError

__all__ = ["FIELDS", "coerce", "parse_bytes", "parse_duration"]

_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(?:([kmgt])(?:i?b)?|b)?\s*$", re.IGNORECASE)
_SIZE_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def parse_bytes(value: str | int) -> int:
    """Parse ``"512m"``, ``"1GiB"``, ``"64 MB"`` or a plain byte count (binary units)."""
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise ValueError(f"not a size: {value!r} (use e.g. 512m, 1g, 65536)")
    if isinstance(value, int):
        return value
    match = _SIZE_RE.match(value)
    if match is None:
        raise ValueError(f"not a size: {value!r} (use e.g. 512m, 1g, 65536)")
    number, unit = match.groups()
    return int(float(number) * _SIZE_UNITS[(unit or "").lower()])


_DURATION_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*$", re.IGNORECASE)
_DURATION_UNITS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_duration(value: str | float) -> float:
    """Parse ``"90"``, ``"10m"``, ``"12h"``, ``"30d"`` or a number of seconds."""
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise ValueError(f"not a duration: {value!r} (use e.g. 600, 10m, 12h, 30d)")
    if isinstance(value, int | float):
        return float(value)
    match = _DURATION_RE.match(value)
    if match is None:
        raise ValueError(f"not a duration: {value!r} (use e.g. 600, 10m, 12h, 30d)")
    number, unit = match.groups()
    return float(number) * _DURATION_UNITS[unit.lower()]


# Every setting by name (config_file records where the settings came from: no one gives it).
FIELDS = SETTINGS


def coerce(name: str, raw: Any) -> Any:
    """Turn a string (env, flag) or TOML value into the field's type, or raise ConfigError."""
    kind = str(FIELDS[name].type)
    unit = FIELDS[name].metadata["unit"]
    if kind.startswith("tuple[int"):
        items = raw.split(",") if isinstance(raw, str) else raw
        try:
            if not isinstance(items, list | tuple) or any(isinstance(item, bool | float) for item in items):
                raise ValueError
            return tuple(int(item) for item in items if str(item).strip())
        except ValueError:
            raise ConfigError(f"{name}: {raw!r} is not a list of whole numbers") from None
    if kind.startswith("tuple"):
        items = raw.split(",") if isinstance(raw, str) else raw
        if not isinstance(items, list | tuple) or not all(isinstance(item, str) for item in items):
            raise ConfigError(f"{name}: {raw!r} is not a list of strings")
        return tuple(item.strip() for item in items if item.strip())
    if not isinstance(raw, str | int | float | bool) or (isinstance(raw, bool) and kind != "bool"):
        raise ConfigError(f"{name}: {raw!r} is not a valid value")
    if isinstance(raw, float) and kind in ("int", "int | None") and not raw.is_integer():
        raise ConfigError(f"{name}: {raw!r} is not a whole number")
    if kind == "int | None" and isinstance(raw, str) and raw.strip().lower() in ("", "none"):
        return None
    try:
        if unit == BYTES:
            return parse_bytes(raw if isinstance(raw, int) else str(raw))
        if unit == DURATION:
            return parse_duration(raw)
        if kind.startswith("Path"):
            return None if raw in ("", None) else Path(str(raw)).expanduser()
        if kind == "bool":
            if isinstance(raw, bool):
                return raw
            text = str(raw).strip().lower()
            if text in ("1", "true", "yes", "on"):
                return True
            if text in ("0", "false", "no", "off", ""):
                return False
            raise ValueError(f"not a boolean: {raw!r}")
        if kind in ("int", "int | None"):
            return int(raw)
        if kind == "float":
            return float(raw)
        if kind.startswith("str"):
            return None if raw in ("", None) and "None" in kind else str(raw)
        return str(raw)
    except ValueError as exc:
        raise ConfigError(f"{name}: {exc}") from exc
