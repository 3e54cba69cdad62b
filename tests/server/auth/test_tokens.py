"""Bearer tokens per tenant, and the exposure checks that ask for them (pure functions, no server)."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from mcp_sandbox.config import Settings, load_settings
from mcp_sandbox.errors import ConfigError
from mcp_sandbox.server.auth.tokens import TenantToken, TokenTable, load_tokens
from mcp_sandbox.server.transport.http import check_exposure, is_loopback, transport_security

ALICE = "alice-token-0123456789abcdef"


def _settings(tmp_path: Path, toml: str = "", **env: str) -> Settings:
    config = tmp_path / "config.toml"
    config.write_text(toml)
    return load_settings(env={f"MCP_SANDBOX_{k.upper()}": v for k, v in env.items()}, config_file=config)


def test_tokens_from_the_environment_and_the_config_file_map_to_their_tenants(tmp_path: Path) -> None:
    digest = hashlib.sha256(b"bob-token-0123456789abcdef").hexdigest()
    settings = _settings(
        tmp_path,
        "[auth]\ntokens = ["
        f'{{ tenant = "alice", token = "{ALICE}" }}, {{ tenant = "bob", token = "sha256:{digest}" }}]',
        token="default-token-0123456789",
    )
    table = TokenTable(load_tokens(settings))
    assert table.tenant(ALICE) == "alice"
    assert table.tenant("bob-token-0123456789abcdef") == "bob"
    assert table.tenant("default-token-0123456789") == "default"
    assert table.tenant("sha256:" + digest) is None  # the digest is not itself a token
    assert table.tenant("") is None
    assert ALICE not in repr(load_tokens(settings))


@pytest.mark.parametrize(
    "tokens",
    [
        '[{ tenant = "alice", token = "short" }]',
        '[{ tenant = "al ice", token = "long-enough-token-0123" }]',
        '[{ tenant = "alice" }]',
        '[{ tenant = "alice", token = "long-enough-token-0123", extra = 1 }]',
        '[{ tenant = "a", token = "same-token-0123456789" }, { tenant = "b", token = "same-token-0123456789" }]',
        '"not a list"',
    ],
)
def test_a_malformed_token_entry_is_a_config_error(tmp_path: Path, tokens: str) -> None:
    with pytest.raises(ConfigError):
        load_tokens(_settings(tmp_path, f"[auth]\ntokens = {tokens}\n"))


@pytest.mark.anyio
async def test_the_verifier_gives_the_tenant_as_client_id_and_refuses_unknown_tokens(tmp_path: Path) -> None:
    table = TokenTable(load_tokens(_settings(tmp_path, token=ALICE)))
    granted = await table.verify_token(ALICE)
    assert granted is not None and granted.client_id == "default"
    assert await table.verify_token(ALICE + "x") is None


@pytest.mark.anyio
async def test_a_replaced_table_refuses_removed_tokens_and_grants_moved_ones_to_their_new_tenant(
    tmp_path: Path,
) -> None:
    bob = "bob-token-0123456789abcdef"

    def tokens(tenant: str, token: str) -> tuple[TenantToken, ...]:
        return load_tokens(_settings(tmp_path, f'[auth]\ntokens = [{{ tenant = "{tenant}", token = "{token}" }}]'))

    table = TokenTable(tokens("alice", ALICE))
    before = await table.verify_token(ALICE)  # granted once before the reload: nothing of it may outlive it
    assert before is not None and before.client_id == "alice"
    table.replace(tokens("carol", bob))
    assert await table.verify_token(ALICE) is None
    table.replace(tokens("dave", ALICE))
    moved = await table.verify_token(ALICE)
    assert moved is not None and moved.client_id == "dave" and moved.token == ALICE
    assert await table.verify_token(bob) is None


@pytest.mark.parametrize(
    ("host", "loopback"),
    [("127.0.0.1", True), ("::1", True), ("localhost", True), ("0.0.0.0", False), ("10.1.2.3", False)],
)
def test_loopback_addresses_are_recognised(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback


def test_listening_beyond_loopback_needs_a_token_and_a_wildcard_needs_host_names(tmp_path: Path) -> None:
    no_token = _settings(tmp_path, host="0.0.0.0")
    with pytest.raises(ConfigError, match="without a bearer token"):
        check_exposure(no_token.http, TokenTable(load_tokens(no_token)))
    wildcard = _settings(tmp_path, host="0.0.0.0", token=ALICE)
    with pytest.raises(ConfigError, match="allowed_hosts"):
        check_exposure(wildcard.http, TokenTable(load_tokens(wildcard)))
    named = _settings(tmp_path, host="0.0.0.0", token=ALICE, public_url="https://sandbox.example.com")
    check_exposure(named.http, TokenTable(load_tokens(named)))
    assert "sandbox.example.com" in transport_security(named.http).allowed_hosts
    assert "https://sandbox.example.com" in transport_security(named.http).allowed_origins
    assert not transport_security(_settings(tmp_path, allowed_hosts="*").http).enable_dns_rebinding_protection
