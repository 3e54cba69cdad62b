"""Setup's bundles of the TypeScript runner: named by what they were built from, readable by the sandbox, pruned.

Running a sandbox on a bundle, and on the sources without one, is tests/engine/test_js_runs.py's.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from mcp_sandbox.config import JS_RUNTIMES, PathSettings, SandboxSettings, Settings, load_settings
from mcp_sandbox.provision.bundles import BUNDLES, build_bundles, bundle_digest, current_bundle
from mcp_sandbox.provision.pins import JS_BINARIES
from mcp_sandbox.runners import runner_dir

_INSTALLED = load_settings(env={}, flags={}).paths.js_runtime_dir


def test_a_bundle_is_named_by_the_sources_the_runtime_and_the_bundler(tmp_path: Path) -> None:
    sources = tmp_path / "typescript"
    shutil.copytree(runner_dir("typescript"), sources)
    name = bundle_digest(sources, "bun", "1.4.5")

    assert name.startswith("bun-") and name == bundle_digest(sources, "bun", "1.4.5")
    assert bundle_digest(sources, "deno", "1.4.5") != name
    assert bundle_digest(sources, "bun", "1.4.6") != name
    runner = sources / "runner.ts"
    runner.write_text(runner.read_text() + "\n")
    assert bundle_digest(sources, "bun", "1.4.5") != name


@pytest.fixture
def runtime_dir(tmp_path: Path) -> Iterator[Path]:
    """A runtime directory holding the installed runtimes (through a link) and no bundle yet."""
    if not all((_INSTALLED / JS_BINARIES[runtime]).is_file() for runtime in JS_RUNTIMES):
        pytest.skip(f"bun and deno are not installed in {_INSTALLED}: run `make runtime`")
    (tmp_path / "node_modules").symlink_to(_INSTALLED / "node_modules")
    old = os.umask(0o077)  # what setup makes must be the sandbox's to read, whatever the umask
    try:
        yield tmp_path
    finally:
        os.umask(old)


def _settings(runtime_dir: Path, runtime: str = "bun") -> Settings:
    return load_settings(env={}, flags={"js_runtime_dir": str(runtime_dir), "js_runtime": runtime})


def _pieces(runtime_dir: Path, runtime: str = "bun") -> tuple[PathSettings, SandboxSettings]:
    settings = _settings(runtime_dir, runtime)
    return settings.paths, settings.sandbox


def test_setup_builds_a_readable_bundle_per_runtime_keeps_a_current_one_and_prunes_stale_ones(
    runtime_dir: Path,
) -> None:
    stale = runtime_dir / "runners" / "bun-0123456789abcdef0123"
    stale.mkdir(parents=True)

    built = build_bundles(_settings(runtime_dir).paths, log=lambda _: None)

    assert [path.name.partition("-")[0] for path in built] == list(JS_RUNTIMES)
    for runtime, directory in zip(JS_RUNTIMES, built, strict=True):
        assert current_bundle(*_pieces(runtime_dir, runtime)) == directory
        bundle = directory / BUNDLES[runtime]
        assert bundle.stat().st_size > 0
        # Beside it, every runner file: the workers the runner starts by a path relative to itself.
        assert {path.name for path in runner_dir("typescript").iterdir()} <= {path.name for path in directory.iterdir()}
        for path in (directory.parent, directory, *directory.iterdir()):
            assert path.stat().st_mode & 0o777 == (0o755 if path.is_dir() else 0o644), path
    assert not stale.exists()
    assert sorted(path.name for path in (runtime_dir / "runners").iterdir()) == sorted(path.name for path in built)

    bundle = built[0] / BUNDLES["bun"]
    before = bundle.stat().st_mtime_ns
    stale.mkdir()  # left by an earlier setup whose prune failed
    assert build_bundles(_settings(runtime_dir).paths, log=lambda _: None) == built
    assert bundle.stat().st_mtime_ns == before  # current: not built again
    assert not stale.exists()  # but the stale one is pruned all the same


def test_without_an_installed_runtime_there_is_no_bundle_and_the_sources_run(tmp_path: Path) -> None:
    lines: list[str] = []
    assert build_bundles(_settings(tmp_path).paths, log=lines.append) == []
    assert current_bundle(*_pieces(tmp_path)) is None
    assert any("not installed" in line for line in lines)
