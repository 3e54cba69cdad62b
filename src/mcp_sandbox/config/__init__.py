"""One typed settings object, built once and injected.

Precedence, highest first: command-line flags, environment (``MCP_SANDBOX_<NAME>``, then the
earlier bridge's ``MCP_BRIDGE_*`` aliases), the TOML file (``--config`` or ``MCP_SANDBOX_CONFIG``),
defaults. Nothing here reads the environment at import time: callers pass it in.

- ``settings``: :class:`Settings`, its defaults and the checks of its values;
- ``values``: parsing what people write (sizes, durations, booleans, lists) into a field's type;
- ``sources``: the TOML file, the environment and its aliases, and :func:`load_settings`.
"""

from mcp_sandbox.config.settings import (
    JS_RUNTIMES,
    OUTPUT_MODES,
    SANDBOX_USER,
    TENANT_DEFAULTS,
    OutputMode,
    Settings,
    default_data_dir,
    default_gate_dir,
    default_js_runtime_dir,
    default_python_runtime,
    default_sandbox_ids,
    default_state_dir,
)
from mcp_sandbox.config.sources import ENV_ALIASES, load_settings
from mcp_sandbox.config.values import parse_bytes, parse_duration

__all__ = [
    "ENV_ALIASES",
    "JS_RUNTIMES",
    "OUTPUT_MODES",
    "SANDBOX_USER",
    "TENANT_DEFAULTS",
    "OutputMode",
    "Settings",
    "default_data_dir",
    "default_gate_dir",
    "default_js_runtime_dir",
    "default_python_runtime",
    "default_sandbox_ids",
    "default_state_dir",
    "load_settings",
    "parse_bytes",
    "parse_duration",
]
