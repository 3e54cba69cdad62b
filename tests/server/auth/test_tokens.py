"""Bearer tokens per tenant, exposure checks, and signed download URLs (pure functions, no server)."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from mcp_sandbox.config import Settings, load_settings
from mcp_sandbox.errors import ConfigError
from mcp_sandbox.server.auth.tokens import TokenTable, load_tokens
from mcp_sandbox.server.transport.http import check_exposure, is_loopback, transport_security
from mcp_sandbox.server.urls import UrlSigner

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


KEY = "ab" * 32


def test_a_file_url_is_valid_for_its_file_until_it_expires() -> None:
    signer = UrlSigner(b"k" * 32, "http://h:1/", ttl=60)
    url = signer.file_url(KEY, "dir/a b.txt", now=1000)
    conversation, expires, signature, name = url.split("/files/")[1].split("/", 3)
    assert name == "dir/a%20b.txt"
    assert signer.check(conversation, expires, signature, "dir/a b.txt", now=1000).verdict == "ok"
    assert signer.check(conversation, expires, signature, "dir/other.txt", now=1000).verdict == "invalid"
    assert signer.check(conversation, expires, signature, "dir/a b.txt", now=1061).verdict == "expired"
    assert signer.check(conversation, str(int(expires) + 1), signature, "dir/a b.txt", now=1000).verdict == "invalid"
    assert signer.check("cd" * 32, expires, signature, "dir/a b.txt", now=1000).verdict == "invalid"
    other_key = UrlSigner(b"x" * 32, "http://h:1", ttl=60)
    assert other_key.check(conversation, expires, signature, "dir/a b.txt", now=1000).verdict == "invalid"


def test_a_base_url_covers_every_file_of_its_conversation_only() -> None:
    signer = UrlSigner(b"k" * 32, "http://h:1", ttl=60)
    base = signer.base_url(KEY, now=1000)
    conversation, expires, signature = base.split("/files/")[1].split("/")
    for name in ("a.txt", "plots/b.png"):
        assert signer.check(conversation, expires, signature, name, now=1000).ok
    assert not signer.check("cd" * 32, expires, signature, "a.txt", now=1000).ok


@pytest.mark.parametrize(
    ("conversation", "expires", "signature"),
    [
        ("xyz", "2000", "f." + "0" * 64),
        (KEY, "-1", "f." + "0" * 64),
        (KEY, "2000", "z." + "0" * 64),
        (KEY, "2000", "f.00"),
    ],
)
def test_malformed_url_parts_are_invalid(conversation: str, expires: str, signature: str) -> None:
    signer = UrlSigner(b"k" * 32, "http://h:1", ttl=60)
    assert signer.check(conversation, expires, signature, "a.txt", now=1000).verdict == "invalid"
