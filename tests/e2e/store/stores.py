"""What the object store tests share: the tenant's token and config, the store's files, the servers' settings."""

from __future__ import annotations

import uuid
from pathlib import Path

from mcp_test_helpers import auth_tokens
from s3_helpers import files, s3_env

ALICE = "alice-token-0123456789abcdef"


def store_config(directory: Path) -> Path:
    """A config file in ``directory`` naming the tenant ``alice`` (``ALICE``)."""
    path = directory / f"objects-{uuid.uuid4().hex[:8]}.toml"
    path.write_text(auth_tokens({"alice": ALICE}))
    return path


def workspace_files(endpoint: str, url: str) -> dict[str, bytes]:
    """The store's workspace files under ``url``: {file name: content} (one conversation's)."""
    found = files(endpoint, url)
    return {name.split("/", 2)[2]: data for name, data in found.items() if name.startswith("workspaces/")}


def store_env(endpoint: str, url: str, **more: str) -> dict[str, str]:
    """A server's settings for the store at ``endpoint`` under ``url``, and ``more``."""
    return {**s3_env(endpoint), "MCP_SANDBOX_OBJECT_STORE_URL": url, **more}
