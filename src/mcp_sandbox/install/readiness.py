"""What stops the server starting on this host, found the way ``open_engine`` would find it."""

from __future__ import annotations

from mcp_sandbox.config import Settings
from mcp_sandbox.engine.startup import backend_for
from mcp_sandbox.errors import SandboxError
from mcp_sandbox.provision import python_status

__all__ = ["problems"]


def problems(settings: Settings) -> list[str]:
    """Each reason ``serve`` would refuse to start here, with what fixes it; empty when it would start.

    No sandbox is started (``doctor`` does that): the runtime's stamp and the backend's probe only.
    """
    found: list[str] = []
    runtime = python_status(settings.paths, settings.sandbox)
    if runtime.missing:
        found.append(f"python_runtime: {runtime.advice()} (in a checkout: `make runtime`)")
    try:
        probe = backend_for(settings).probe()
    except SandboxError as exc:  # an unknown name, or a probe that cannot run: say why
        return [*found, f"backend {settings.sandbox.backend}: {exc}"]
    if not probe.available:
        found.append(f"backend {probe.name} is unavailable here: {probe.reason}")
    elif probe.missing() and not settings.sandbox.accept_weaker_isolation:
        found.append(
            f"backend {probe.name} cannot enforce: {probe.missing_summary()}; fix the host, or accept it "
            f"with --accept-weaker-isolation (install with that flag too: the entry then carries it)"
        )
    return found
