"""Fixtures of the workspace tests: a store over a real state directory, as the server uses it."""

from __future__ import annotations

from pathlib import Path

import pytest

from mcp_sandbox.config import Settings, load_settings
from mcp_sandbox.workspace import WorkspaceStore, load_secret
from settings_helpers import store_of


@pytest.fixture
def settings(state_dir: Path) -> Settings:
    return load_settings(env={}, flags={"state_dir": str(state_dir)})


@pytest.fixture
def store(settings: Settings) -> WorkspaceStore:
    store = store_of(settings, load_secret(settings.paths.state_dir))
    store.prepare()
    return store


@pytest.fixture
def key(store: WorkspaceStore) -> str:
    return store.key("alice", "conversation-1")


@pytest.fixture
def workspace(store: WorkspaceStore, key: str) -> Path:
    """The conversation's directory, made; tests play sandboxed code by writing into it directly."""
    return store.ensure(key)
