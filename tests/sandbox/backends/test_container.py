"""Which container CLI, dialect and image a backend uses, from the settings (no engine needed)."""

from __future__ import annotations

import pytest

from mcp_sandbox.config import load_settings
from mcp_sandbox.engine.startup import backend_for
from mcp_sandbox.errors import ConfigError
from mcp_sandbox.sandbox.backends.container import DEFAULT_IMAGE, ContainerBackend


def _backend(name: str, env: dict[str, str]) -> ContainerBackend:
    backend = backend_for(load_settings(env=env, flags={}), name)
    assert isinstance(backend, ContainerBackend)
    return backend


@pytest.mark.parametrize(
    ("runtime", "flavour"),
    [("docker", "docker"), ("/opt/bin/podman", "podman"), ("/usr/local/bin/docker-wrapper", "docker")],
)
def test_the_earlier_bridges_runtime_variable_picks_the_cli_of_backend_container(runtime: str, flavour: str) -> None:
    backend = _backend("container", {"MCP_BRIDGE_RUNTIME": runtime})

    assert (backend.name, backend.flavour, backend.engine.cli_name) == ("container", flavour, runtime)


def test_an_explicit_backend_ignores_a_runtime_of_the_other_dialect() -> None:
    docker = _backend("docker", {"MCP_BRIDGE_RUNTIME": "/usr/bin/podman"})
    podman = _backend("podman", {"MCP_BRIDGE_RUNTIME": "/usr/bin/podman"})

    assert (docker.flavour, docker.engine.cli_name) == ("docker", "docker")
    assert (podman.flavour, podman.engine.cli_name) == ("podman", "/usr/bin/podman")


def test_images_are_chosen_per_language_then_image_then_the_default() -> None:
    env = {"MCP_BRIDGE_IMAGE": "team/base:1", "MCP_SANDBOX_IMAGES": "typescript=team/node:2"}

    backend = _backend("podman", env)

    assert backend.image_for("typescript") == "team/node:2"
    assert backend.image_for("python") == "team/base:1"
    assert _backend("podman", {}).image_for("python") == DEFAULT_IMAGE


def test_a_malformed_images_entry_is_a_config_error() -> None:
    with pytest.raises(ConfigError):
        load_settings(env={"MCP_SANDBOX_IMAGES": "python"}, flags={})


def test_an_unknown_backend_is_a_config_error() -> None:
    with pytest.raises(ConfigError):
        backend_for(load_settings(env={}, flags={}), "lxc")
