"""Secrets from ``[[secrets]]`` and ``MCP_SANDBOX_SECRET_<NAME>``: read once, checked, never shown."""

from __future__ import annotations

from pathlib import Path

import pytest

from mcp_sandbox.config import load_settings
from mcp_sandbox.engine.startup import tenant_egress
from mcp_sandbox.errors import ConfigError

VALUE = "tok-" + "Zr81kPq02LmX"


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "config.toml"
    path.write_text(text)
    return path


def test_a_secret_is_read_from_the_environment_or_a_file_and_shown_only_as_a_hash(tmp_path: Path) -> None:
    (tmp_path / "key").write_text(VALUE + "\n")
    config = write(
        tmp_path,
        f"""
        [[secrets]]
        name = "github"
        tenant = "alice"
        value_from = "file:{tmp_path / "key"}"
        hosts = ["api.github.test"]
        header = "X-Token"
        template = "token {{value}}"
        """,
    )
    env = {"OPENAI": VALUE + "2", "MCP_SANDBOX_SECRET_OPENAI": '{ value_from = "env:OPENAI", hosts = ["*.ai.test"] }'}
    settings = load_settings(env=env, config_file=config)
    github, openai = settings.egress.secrets
    assert (github.name, github.tenant, github.header, github.header_value()) == (
        "github",
        "alice",
        "X-Token",
        f"token {VALUE}",
    )
    assert (openai.name, openai.tenant, openai.header, openai.header_value()) == (
        "openai",
        "default",
        "Authorization",
        f"Bearer {VALUE}2",
    )
    shown = repr(settings) + str(settings.egress.secrets) + f"{openai.value}"
    assert VALUE not in shown and openai.value.digest in shown


@pytest.mark.parametrize(
    ("entry", "named"),
    [
        ('value_from = "env:MISSING", hosts = ["a.test"]', "MISSING"),
        ('value_from = "env:SHORT", hosts = ["a.test"]', "shorter"),
        ('value_from = "env:WIDE", hosts = ["a.test"]', "non-ASCII"),
        ('value_from = "plain-text-value", hosts = ["a.test"]', "value_from"),
        ('value_from = "env:KEY"', "hosts"),
        ('value_from = "env:KEY", hosts = ["*"]', "hosts"),
        ('value_from = "env:KEY", hosts = ["a.test"], template = "Bearer"', "template"),
        ('value_from = "env:KEY", hosts = ["a.test"], header = "Host"', "header"),
        ('value_from = "env:KEY", hosts = ["a.test"], placeholder_env = "1X"', "placeholder_env"),
        ('value_from = "env:KEY", hosts = ["a.test"], colour = "red"', "colour"),
    ],
)
def test_a_malformed_secret_is_refused_naming_what_is_wrong(entry: str, named: str) -> None:
    env = {"KEY": VALUE, "SHORT": "abc", "WIDE": "ключ-1234567", "MCP_SANDBOX_SECRET_API": f"{{ {entry} }}"}
    with pytest.raises(ConfigError, match=named) as caught:
        load_settings(env=env)
    assert VALUE not in str(caught.value)


def test_a_secret_declared_twice_for_one_tenant_is_refused(tmp_path: Path) -> None:
    entry = '[[secrets]]\nname = "api"\nvalue_from = "env:KEY"\nhosts = ["a.test"]\n'
    with pytest.raises(ConfigError, match="twice"):
        load_settings(env={"KEY": VALUE}, config_file=write(tmp_path, entry * 2))


def test_a_secrets_hosts_join_its_tenants_allowlist_only() -> None:
    env = {
        "KEY": VALUE,
        "MCP_SANDBOX_SECRET_API": '{ value_from = "env:KEY", hosts = ["api.test"], tenant = "alice" }',
    }
    egress = tenant_egress(load_settings(env=env, flags={"egress_allow": "web.test"}))
    assert egress.rules("alice").allow == ("web.test", "api.test")
    assert egress.rules("bob").allow == ("web.test",)
    assert egress.secret_names("alice") == ["api"] and egress.secret_names("bob") == []
    alice, again = egress.grant("alice", True, "c1"), egress.grant("alice", True, "c1")
    bob = egress.grant("bob", True, "c1")
    assert alice is not None and again is not None and bob is not None
    assert alice.secrets[0].placeholder != again.secrets[0].placeholder
    assert bob.secrets == ()
