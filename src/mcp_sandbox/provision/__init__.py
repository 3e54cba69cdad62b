"""``mcp-sandbox setup``: build the sandbox's runtimes where the settings say, from package indexes.

A wheel install (``pipx install``, ``uvx``) has no checkout and no ``make``: this package builds
what ``make runtime`` builds there, from the pins shipped in the wheel (``pins/``), into the
user's data directory (:func:`mcp_sandbox.config.default_data_dir`).

- ``pins``: the pinned Python data stack and the JavaScript runtimes' lockfile, as package data;
- ``status``: is a runtime there and current, and the one command that fixes it when not;
- ``python``: the Python runtime, a venv of the system interpreter plus ``runtime_packages``;
- ``js``: the JavaScript runtimes (bun, deno) through npm;
- ``command``: the ``setup`` subcommand's arguments and report.
"""

from mcp_sandbox.provision.status import FIX_COMMAND, RuntimeStatus, js_status, python_status

__all__ = ["FIX_COMMAND", "RuntimeStatus", "js_status", "python_status"]
