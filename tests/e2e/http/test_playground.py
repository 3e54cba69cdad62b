"""The web playground at ``/``, in headless Chromium driven by Playwright, against a real ``serve --transport http``.

Debian's ``chromium`` (``make browser``) runs the page; Playwright only drives it (no browser is
ever downloaded). Every test records every request the page makes and fails if one went to
another host than the server, or if the page's Content-Security-Policy blocked anything.
Screenshots of the main states land in ``test-artifacts/playground/`` (look at them).
"""

from __future__ import annotations

import json
import os
import re
import sys
import textwrap
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

import httpx2
import pytest
from playwright.async_api import Browser, Locator, Page, Request, Response, async_playwright, expect

from downstream import FIXTURE_SERVER
from mcp_sandbox.server.routes.playground import STATIC_DIR
from mcp_test_helpers import host_processes, http_client, http_server

pytestmark = [pytest.mark.e2e, pytest.mark.anyio]

TOKEN = "playground-token-0123456789abcdef"
CHROMIUM = Path("/usr/bin/chromium")
ARTIFACTS = Path(__file__).resolve().parents[3] / "test-artifacts" / "playground"
RUN_BOUND_MS = 90_000
# Root in a container or CI: Chromium's own sandbox needs user namespaces it may not get here.
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def _is_run_answer(response: Response) -> bool:
    """Whether ``response`` has a run's result: the answer to its task's ``tasks/result`` (the page
    runs ``run_code`` as a task)."""
    body = response.request.post_data or ""
    return urlsplit(response.url).path == "/mcp" and '"tasks/result"' in body


def _tool_result(body: str) -> dict[str, Any]:
    """The ``result`` of the JSON-RPC answer in ``body`` (JSON, or an event stream's last data)."""
    if body.lstrip().startswith("{"):
        return dict(json.loads(body)["result"])
    data = [line[5:].strip() for line in body.splitlines() if line.startswith("data:")]
    answers = [json.loads(item) for item in data if item]
    return dict(next(answer["result"] for answer in answers if "result" in answer))


def _require_chromium_and_the_bundle() -> None:
    if not CHROMIUM.exists():
        reason = f"{CHROMIUM} is missing: run `make browser` (Debian's chromium package)"
    elif not (STATIC_DIR / "playground.js").exists():
        reason = f"the playground is not built ({STATIC_DIR} has no playground.js): run `make web`"
    else:
        return
    if os.environ.get("MAKELEVEL") or os.environ.get("CI"):
        pytest.fail(reason, pytrace=False)
    pytest.skip(reason)


@pytest.fixture(scope="module")
async def base(module_state_dir: Path, sandbox_runtime: Path | None) -> AsyncIterator[str]:
    _require_chromium_and_the_bundle()
    # One downstream server (our fixture) makes the code-mode example appear.
    config = module_state_dir.parent / f"servers-{uuid.uuid4().hex[:8]}.json"
    fixture = {"command": sys.executable, "args": [str(FIXTURE_SERVER)]}
    config.write_text(json.dumps({"mcpServers": {"fixture": fixture}}))
    env = {"MCP_SANDBOX_TOKEN": TOKEN}
    async with http_server(module_state_dir, "--servers-config", str(config), env=env, runtime=sandbox_runtime) as url:
        yield url


@pytest.fixture(scope="module")
async def browser() -> AsyncIterator[Browser]:
    _require_chromium_and_the_bundle()
    async with async_playwright() as playwright:
        # A fresh profile directory each launch (Playwright makes one and removes it).
        launched = await playwright.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_ARGS)
        try:
            yield launched
        finally:
            await launched.close()


class Watched:
    """A page and what it did: every request's URL, its MCP messages, and the CSP violations it reported."""

    def __init__(self, page: Page) -> None:
        self.page = page
        self.requests: list[str] = []
        self.messages: list[dict[str, Any]] = []
        self.csp_violations: list[str] = []
        page.on("request", self._request)
        page.on(
            "console",
            lambda message: (
                self.csp_violations.append(message.text) if "Content Security Policy" in message.text else None
            ),
        )

    def _request(self, request: Request) -> None:
        self.requests.append(request.url)
        if request.method == "POST" and urlsplit(request.url).path == "/mcp" and request.post_data:
            self.messages.append(json.loads(request.post_data))

    def runs(self) -> list[dict[str, Any]]:
        """The arguments of every ``run_code`` call the page made."""
        return [
            message["params"]["arguments"]
            for message in self.messages
            if message.get("method") == "tools/call" and message["params"]["name"] == "run_code"
        ]

    def check(self, base: str) -> None:
        """Every request went to the server at ``base`` (inline ``data:`` images aside); CSP blocked nothing."""
        server = urlsplit(base)
        elsewhere = [
            url
            for url in self.requests
            if urlsplit(url).scheme != "data" and (urlsplit(url).scheme, urlsplit(url).netloc) != server[:2]
        ]
        assert self.requests, "the page made no request at all"
        assert elsewhere == [], f"the page made requests to other hosts: {elsewhere}"
        assert self.csp_violations == []


@pytest.fixture
async def watched(browser: Browser, base: str) -> AsyncIterator[Watched]:
    context = await browser.new_context(viewport={"width": 1280, "height": 900})
    page = await context.new_page()
    page.set_default_timeout(RUN_BOUND_MS)
    seen = Watched(page)
    try:
        yield seen
    finally:
        await context.close()
    seen.check(base)


async def screenshot(page: Page, name: str) -> None:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    await page.screenshot(path=str(ARTIFACTS / f"{name}.png"), full_page=True)


async def connect(page: Page, base: str, token: str = TOKEN) -> None:
    await page.goto(base + "/")
    await page.get_by_label("API token").fill(token)
    await page.get_by_role("button", name="Connect").click()
    if token == TOKEN:
        await expect(page.locator("#connection")).to_have_class(re.compile(r"\bok\b"))


async def set_code(page: Page, code: str) -> None:
    await page.locator(".cm-content").click()
    await page.keyboard.press("Control+A")
    await page.keyboard.press("Delete")
    await page.keyboard.insert_text(code)


async def run_and_wait(page: Page) -> str:
    """Click Run; the status the run ended with."""
    await page.get_by_role("button", name=re.compile("^Run")).click()
    status = page.locator("#status")
    await expect(status).not_to_have_class(re.compile(r"\b(idle|running)\b"), timeout=RUN_BOUND_MS)
    return await status.inner_text()


# --- the page and its headers --------------------------------------------------------------------


async def test_the_page_has_no_secret_and_a_strict_content_security_policy(base: str) -> None:
    async with httpx2.AsyncClient(timeout=30) as web:
        page = await web.get(base + "/")
        script = await web.get(base + "/static/playground.js")
        missing = await web.get(base + "/static/../http.py")

    assert page.status_code == 200
    assert page.headers["content-type"].startswith("text/html")
    assert TOKEN not in page.text
    policy = page.headers["content-security-policy"]
    directives = dict(part.strip().split(" ", 1) for part in policy.split(";"))
    assert directives["default-src"] == "'none'"
    assert directives["script-src"] == "'self'"
    assert directives["connect-src"] == "'self'"
    assert "unsafe-inline" not in policy and "unsafe-eval" not in policy
    nonce = re.search(r"'nonce-([^']+)'", directives["style-src"])
    assert nonce is not None and f'content="{nonce.group(1)}"' in page.text
    assert "<script>" not in page.text  # no inline script: only <script type=module src=...>
    assert script.status_code == 200 and script.headers["content-type"].startswith("text/javascript")
    assert missing.status_code == 404


# --- connecting ----------------------------------------------------------------------------------


async def test_a_wrong_token_is_shown_as_an_error(watched: Watched, base: str) -> None:
    page = watched.page
    await connect(page, base, token="not-the-token")

    await expect(page.locator("#connection")).to_have_class(re.compile(r"\bbad\b"))
    await expect(page.locator("#connection")).to_contain_text("refused the token")
    await expect(page.locator("#error")).to_be_visible()
    await expect(page.get_by_role("button", name=re.compile("^Run"))).to_be_disabled()
    await screenshot(page, "wrong-token")


async def test_the_token_stays_in_session_storage_only(watched: Watched, base: str) -> None:
    page = watched.page
    await connect(page, base)

    stored = await page.evaluate(
        "() => ({session: sessionStorage.getItem('mcp-sandbox.token'), local: localStorage.length, "
        "url: location.href, cookies: document.cookie, field: document.getElementById('token').value})"
    )
    assert stored == {"session": TOKEN, "local": 0, "url": base + "/", "cookies": "", "field": ""}
    # A reload connects again from session storage, without asking.
    await page.reload()
    await expect(page.locator("#connection")).to_have_class(re.compile(r"\bok\b"))


# --- every example of every language --------------------------------------------------------------

# (language, example id, what the page shows once it ran)
EXAMPLES = [
    ("python", "hello", "Hello, world!"),
    ("python", "pandas", "Revenue by region"),
    ("python", "plot", "plotted 400 points"),
    ("python", "files", "read back 10 rows"),
    ("python", "uploads", "no CSV file in /workspace yet"),
    ("python", "variables", "run 1 in this conversation"),
    ("python", "environment", "GREETING = (not set)"),
    ("python", "code-mode", "fixture"),
    ("typescript", "hello", "Hello, world!"),
    ("typescript", "fibonacci", "0, 1, 1, 2, 3, 5, 8, 13, 21, 34"),
    ("typescript", "files", "items: 1, 2, 3"),
    ("javascript", "hello", "Hello, world!"),
    ("javascript", "fibonacci", "fib(100) = 354224848179261915075"),
]


@pytest.mark.parametrize(("language", "example", "shown"), EXAMPLES, ids=[f"{lang}-{ex}" for lang, ex, _ in EXAMPLES])
async def test_each_example_runs_and_shows_its_output(
    watched: Watched, base: str, language: str, example: str, shown: str
) -> None:
    page = watched.page
    await connect(page, base)
    await page.get_by_label("Language").select_option(language)
    await page.get_by_label("Example").select_option(example)

    assert await run_and_wait(page) == "success"

    await expect(page.locator("#stdout-block")).to_contain_text(shown)
    await expect(page.locator("#exit-code")).to_have_text("exit code 0")
    await expect(page.locator("#duration")).to_have_text(re.compile(r"^\d+ ms$"))
    if example == "pandas":
        # Markdown output is rendered: a real table.
        await expect(page.locator("#stdout-markdown table td").first).to_have_text("east")
        await screenshot(page, "markdown")
    if example == "plot":
        image = page.locator("#images img")
        await expect(image).to_have_count(1)
        width = await image.evaluate("(img) => img.naturalWidth")
        assert width > 100
        await screenshot(page, "plot")
    if example == "files":
        name = "squares.csv" if language == "python" else "notes.json"
        link = page.get_by_role("link", name=f"Download {name}")
        body = await page.evaluate("async (href) => (await fetch(href)).text()", await link.get_attribute("href"))
        if language == "python":
            assert body.splitlines()[:3] == ["n,square", "1,1", "2,4"]
        else:
            assert json.loads(body)["items"] == [1, 2, 3]
        if language == "python":
            await screenshot(page, "files")


async def test_the_code_mode_example_is_listed_only_for_python(watched: Watched, base: str) -> None:
    page = watched.page
    await connect(page, base)
    await page.get_by_label("Language").select_option("typescript")
    examples = await page.get_by_label("Example").locator("option").evaluate_all("(os) => os.map((o) => o.value)")
    assert examples == ["hello", "fibonacci", "files"]


async def test_the_network_checkbox_is_hidden_when_the_server_cannot_grant_network(watched: Watched, base: str) -> None:
    page = watched.page
    await connect(page, base)

    # This server grants no network (list_runners says so): the page offers none.
    await expect(page.get_by_label("Network access")).to_be_hidden()


async def test_ctrl_enter_runs_the_code_in_the_editor(watched: Watched, base: str) -> None:
    page = watched.page
    await connect(page, base)
    await set_code(page, "print(6 * 7)")

    await page.keyboard.press("Control+Enter")

    await expect(page.locator("#status")).to_have_text("success", timeout=RUN_BOUND_MS)
    await expect(page.locator("#stdout")).to_have_text("42\n")


# --- running: live output, environment, timeout, errors --------------------------------------------


async def test_output_shows_while_the_run_lasts(watched: Watched, base: str, tmp_path: Path) -> None:
    # The code waits for a file that the test uploads only once the page showed the first line:
    # the run can end only if its output reached the page while it ran.
    page = watched.page
    await connect(page, base)
    await page.get_by_role("button", name="New conversation").click()  # the upload must reach the run
    await set_code(
        page,
        textwrap.dedent("""
            import os, time
            print("waiting for the go file", flush=True)
            while not os.path.exists("/workspace/go"):
                time.sleep(0.05)
            print("done")
        """),
    )
    await page.get_by_role("button", name=re.compile("^Run")).click()
    await expect(page.locator("#live")).to_contain_text("waiting for the go file", timeout=RUN_BOUND_MS)
    await expect(page.locator("#status")).to_have_text("running…")
    await screenshot(page, "running")
    go = tmp_path / "go"
    go.write_text("go")

    await page.get_by_label("Upload files").set_input_files(str(go))

    await expect(page.locator("#status")).to_have_text("success", timeout=RUN_BOUND_MS)
    await expect(page.locator("#stdout")).to_have_text("waiting for the go file\ndone\n")


async def test_environment_rows_reach_the_code(watched: Watched, base: str) -> None:
    page = watched.page
    await connect(page, base)
    await page.get_by_label("Example").select_option("environment")
    await page.get_by_label("Variable 1 name").fill("GREETING")
    await page.get_by_label("Variable 1 value").fill("hello from the page")

    assert await run_and_wait(page) == "success"

    await expect(page.locator("#stdout")).to_have_text("GREETING = hello from the page\n")


async def test_a_timeout_is_shown_as_a_timeout(watched: Watched, base: str) -> None:
    page = watched.page
    await connect(page, base)
    await set_code(page, "import time\nprint('sleeping', flush=True)\ntime.sleep(60)")
    await page.get_by_label("Timeout (s)").fill("2")

    assert await run_and_wait(page) == "timeout"

    await expect(page.locator("#status")).to_have_class(re.compile(r"\btimeout\b"))
    await expect(page.locator("#error")).to_contain_text("2")
    await screenshot(page, "timeout")


async def test_stdout_and_stderr_are_shown_apart_with_the_exit_code(watched: Watched, base: str) -> None:
    page = watched.page
    await connect(page, base)
    await set_code(page, "import sys\nprint('to out')\nprint('to err', file=sys.stderr)\nsys.exit(3)")

    assert await run_and_wait(page) == "error"

    await expect(page.locator("#stdout")).to_have_text("to out\n")
    await expect(page.locator("#stderr")).to_have_text("to err\n")
    await expect(page.locator("#exit-code")).to_have_text("exit code 3")


# --- conversations: a choice, not the default -------------------------------------------------------


async def test_a_run_takes_no_conversation_until_one_is_chosen(watched: Watched, base: str) -> None:
    page = watched.page
    await connect(page, base)
    await expect(page.get_by_label("Conversation", exact=True)).to_have_value("")
    await expect(page.locator("#conversation-help")).to_contain_text("nothing is kept")

    async with page.expect_response(lambda response: _is_run_answer(response)) as answer:
        assert await run_and_wait(page) == "success"

    # The call named no conversation, and the server ran it without one (no session in the result).
    assert [("conversationId" in arguments) for arguments in watched.runs()] == [False]
    result = _tool_result(await (await answer.value).text())
    assert result["structuredContent"]["status"] == "success"
    assert "session" not in result["structuredContent"]
    await expect(page.locator("#place")).to_have_text("no conversation: a fresh sandbox, nothing kept")


async def test_a_new_conversation_keeps_a_variable_from_one_run_to_the_next(watched: Watched, base: str) -> None:
    page = watched.page
    await connect(page, base)

    await page.get_by_role("button", name="New conversation").click()
    conversation = await page.get_by_label("Conversation", exact=True).input_value()
    assert re.fullmatch(r"playground-[0-9a-f]{12}", conversation)
    help_text = page.locator("#conversation-help")
    await expect(help_text).to_contain_text("keep its files in /workspace and its Python variables")
    await set_code(page, "answer = 41\nprint('set')")
    assert await run_and_wait(page) == "success"
    await expect(page.locator("#place")).to_have_text("conversation: a new interpreter")
    await set_code(page, "print(answer + 1)")
    assert await run_and_wait(page) == "success"

    await expect(page.locator("#stdout")).to_have_text("42\n")
    await expect(page.locator("#place")).to_have_text("conversation: variables kept")
    assert [arguments.get("conversationId") for arguments in watched.runs()] == [conversation, conversation]
    await screenshot(page, "conversation")
    await page.get_by_role("button", name="Leave").click()
    await expect(page.get_by_label("Conversation", exact=True)).to_have_value("")


# --- the conversations list, and branching ----------------------------------------------------------


def _conversation_row(page: Page, conversation: str) -> Locator:
    return page.locator("#conversation-list tbody tr", has=page.locator("button", has_text=conversation))


async def test_the_list_shows_the_conversations_used_here_and_switches_to_one(watched: Watched, base: str) -> None:
    page = watched.page
    await connect(page, base)
    field = page.get_by_label("Conversation", exact=True)
    await page.get_by_role("button", name="New conversation").click()
    first = await field.input_value()
    await set_code(page, "kept = 'first'\nopen('/workspace/one.txt', 'w').write('1')")
    assert await run_and_wait(page) == "success"
    await page.get_by_role("button", name="New conversation").click()
    second = await field.input_value()
    await set_code(page, "open('/workspace/a.txt', 'w').write('aa')\nopen('/workspace/b.txt', 'w').write('bbb')")
    assert await run_and_wait(page) == "success"

    # Most recently used first, with each one's files and bytes from the server's index.
    rows = page.locator("#conversation-list tbody tr")
    await expect(rows.locator("th")).to_have_text([second, first])
    await expect(_conversation_row(page, second).locator("td")).to_have_text([re.compile(r"ago|now"), "2", "5 B"])
    await expect(_conversation_row(page, first).locator("td")).to_have_text([re.compile(r"ago|now"), "1", "1 B"])
    await expect(_conversation_row(page, second)).to_have_attribute("aria-current", "true")
    await screenshot(page, "conversations")

    # Switching by keyboard: the runs go there, its files are shown, its variables are there.
    await page.get_by_role("button", name=f"Switch to conversation {first}").focus()
    await page.keyboard.press("Enter")

    await expect(field).to_have_value(first)
    await expect(_conversation_row(page, first)).to_have_attribute("aria-current", "true")
    await expect(page.locator("#files tbody tr")).to_have_count(1)
    await expect(page.get_by_role("link", name="Download one.txt")).to_be_visible()
    await set_code(page, "print(kept)")
    assert await run_and_wait(page) == "success"
    await expect(page.locator("#stdout")).to_have_text("first\n")
    assert [arguments.get("conversationId") for arguments in watched.runs()] == [first, second, first]


async def test_a_conversation_used_elsewhere_is_counted_but_not_named(watched: Watched, base: str) -> None:
    page = watched.page
    async with httpx2.AsyncClient(timeout=30, headers={"Authorization": f"Bearer {TOKEN}"}) as web:
        stored = await web.post(
            base + "/upload", params={"conversationId": f"elsewhere-{uuid.uuid4().hex}", "filename": "x"}, content=b"x"
        )
    assert stored.status_code == 201

    await connect(page, base)

    await expect(page.locator("#conversation-list-help")).to_contain_text(re.compile(r"\d+ more of yours"))
    await expect(page.locator("#conversation-list")).to_be_hidden()  # none of them used in this tab
    assert "elsewhere-" not in await page.locator(".conversation-list").inner_text()


async def test_branch_sends_fork_from_the_current_conversation_with_a_new_id(watched: Watched, base: str) -> None:
    # The request only: whether the server makes the fork is the next test's.
    page = watched.page
    await connect(page, base)
    branch = page.get_by_role("button", name="Branch")
    await expect(branch).to_be_hidden()  # no conversation, nothing to branch from
    field = page.get_by_label("Conversation", exact=True)
    await page.get_by_role("button", name="New conversation").click()
    source = await field.input_value()
    await set_code(page, "x = 1")
    assert await run_and_wait(page) == "success"

    await branch.click()

    fork = await field.input_value()
    assert re.fullmatch(r"playground-[0-9a-f]{12}", fork) and fork != source
    await expect(page.locator("#conversation-help")).to_contain_text(f"A branch of {source}")
    await expect(branch).to_be_hidden()
    await run_and_wait(page)
    await page.get_by_role("button", name="Leave").click()
    assert await run_and_wait(page) == "success"
    assert [(run.get("conversationId"), run.get("forkFrom")) for run in watched.runs()] == [
        (source, None),
        (fork, source),
        (None, None),
    ]


@pytest.fixture
async def forking(base: str) -> None:
    """Skip unless this server's ``run_code`` takes ``forkFrom`` (asked before the page opens)."""
    async with http_client(base, TOKEN) as client:
        tools = (await client.list_tools()).tools
    if not all("forkFrom" in tool.input_schema.get("properties", {}) for tool in tools if tool.name == "run_code"):
        pytest.skip("run_code takes no forkFrom on this server yet (issue 38's fork)")


async def test_a_branch_starts_from_a_copy_of_the_source_and_then_goes_its_own_way(
    forking: None, watched: Watched, base: str
) -> None:
    page = watched.page
    await connect(page, base)
    field = page.get_by_label("Conversation", exact=True)
    await page.get_by_role("button", name="New conversation").click()
    source = await field.input_value()
    await set_code(page, "x = 41\nopen('/workspace/a.txt', 'w').write('from the source')")
    assert await run_and_wait(page) == "success"

    await page.get_by_role("button", name="Branch").click()
    fork = await field.input_value()
    await set_code(
        page, "print(x + 1, open('/workspace/a.txt').read())\nx = 0\nopen('/workspace/b.txt', 'w').write('b')"
    )
    assert await run_and_wait(page) == "success"

    await expect(page.locator("#stdout")).to_have_text("42 from the source\n")
    await expect(page.locator("#place")).to_contain_text(f"a branch of {source}")
    await expect(page.locator("#files tbody tr")).to_have_count(2)
    await expect(page.locator("#conversation-list tbody tr th")).to_have_text([fork, source])
    await screenshot(page, "branch")
    # The branch is made: its next run names no source; each side keeps its own writes.
    await set_code(page, "print(x)")
    assert await run_and_wait(page) == "success"
    await expect(page.locator("#stdout")).to_have_text("0\n")
    await page.get_by_role("button", name=f"Switch to conversation {source}").click()
    await set_code(page, "import os\nprint(x, os.path.exists('/workspace/b.txt'))")
    assert await run_and_wait(page) == "success"
    await expect(page.locator("#stdout")).to_have_text("41 False\n")
    assert [(run.get("conversationId"), run.get("forkFrom")) for run in watched.runs()] == [
        (source, None),
        (fork, source),
        (fork, None),
        (source, None),
    ]


# --- stopping a run -----------------------------------------------------------------------------------


async def test_a_long_run_is_shown_as_a_task_and_stop_cancels_it(watched: Watched, base: str) -> None:
    # The run starts a `sleep` with a number of its own: the host sees that process while the
    # task works, and must not once the server answered Stop's tasks/cancel.
    marker = f"3600.{uuid.uuid4().int % 10**9:09d}"
    page = watched.page
    await connect(page, base)
    await expect(page.get_by_role("button", name="Stop")).to_be_hidden()
    await set_code(
        page,
        textwrap.dedent(f"""
            import itertools, subprocess, time
            subprocess.Popen(["sleep", "{marker}"])
            for step in itertools.count():
                print(f"step {{step}}", flush=True)
                time.sleep(0.2)
        """),
    )
    await page.get_by_role("button", name=re.compile("^Run")).click()
    elapsed = page.locator("#task-elapsed")
    await expect(page.locator("#task-status")).to_have_text("working", timeout=RUN_BOUND_MS)
    await expect(page.locator("#task-output")).to_have_text(re.compile(r"^step \d+$"), timeout=RUN_BOUND_MS)
    await expect(elapsed).to_have_text(re.compile(r"^\d+ s$"))
    shown = await elapsed.inner_text()
    await expect(elapsed).not_to_have_text(shown, timeout=10_000)  # it ticks
    await expect(page.locator("#live")).to_contain_text("step 1")  # and the output so far shows
    await screenshot(page, "task")
    assert host_processes(marker) != []
    task_id = await page.locator("#task-id").inner_text()
    calls = [m["params"] for m in watched.messages if m.get("method") == "tools/call"]
    assert calls[-1]["name"] == "run_code" and calls[-1]["task"] == {}

    await page.get_by_role("button", name="Stop").click()

    await expect(page.locator("#task-status")).to_have_text("cancelled", timeout=RUN_BOUND_MS)
    assert host_processes(marker) == []  # ended before the server answered the cancel
    await expect(page.locator("#status")).to_have_text("cancelled")
    await expect(page.locator("#notice")).to_contain_text("the task was cancelled and its sandbox killed")
    await expect(page.get_by_role("button", name="Stop")).to_be_hidden()
    cancels = [m["params"] for m in watched.messages if m.get("method") in ("tasks/cancel", "notifications/cancelled")]
    assert cancels == [{"taskId": task_id}]
    await screenshot(page, "cancelled")
    # The slot is free again: the next run runs, a short one never shown as a task.
    await set_code(page, "print('after the stop')")
    assert await run_and_wait(page) == "success"
    await expect(page.locator("#stdout")).to_have_text("after the stop\n")
    await expect(page.locator("#task-block")).to_be_hidden()


# --- files ------------------------------------------------------------------------------------------


async def test_an_uploaded_csv_is_listed_and_read_from_code(watched: Watched, base: str, tmp_path: Path) -> None:
    page = watched.page
    await connect(page, base)
    csv = tmp_path / "data.csv"
    csv.write_text("a,b\n1,2\n3,4\n")

    await page.get_by_label("Upload files").set_input_files(str(csv))

    await expect(page.locator("#upload-status")).to_have_text("Uploaded data.csv to /workspace.")
    row = page.locator("#files tbody tr", has_text="data.csv")
    await expect(row).to_contain_text("12 B")
    link = page.get_by_role("link", name="Download data.csv")
    assert await page.evaluate("async (href) => (await fetch(href)).text()", await link.get_attribute("href")) == (
        "a,b\n1,2\n3,4\n"
    )
    await page.get_by_label("Example").select_option("uploads")
    assert await run_and_wait(page) == "success"
    await expect(page.locator("#stdout")).to_contain_text("data.csv: 2 rows, columns ['a', 'b']")
    await screenshot(page, "upload")


async def test_a_dropped_file_is_uploaded(watched: Watched, base: str) -> None:
    page = watched.page
    await connect(page, base)
    dropped = await page.evaluate_handle(
        "() => { const data = new DataTransfer(); "
        "data.items.add(new File(['x,y\\n5,6\\n'], 'dropped.csv', {type: 'text/csv'})); return data; }"
    )

    await page.dispatch_event("#drop", "drop", {"dataTransfer": dropped})

    await expect(page.locator("#files tbody tr", has_text="dropped.csv")).to_contain_text("8 B")


# --- output is never code ----------------------------------------------------------------------------

HOSTILE = textwrap.dedent("""
    import sys
    print("# Report")
    print("<script>window.__pwned = 'script'</script>")
    print('<img src="x" onerror="window.__pwned = \\'img\\'">')
    print("[click](javascript:window.__pwned='link')")
    print("**bold** <svg onload=\\"window.__pwned='svg'\\"></svg>", flush=True)
    print("<script>window.__pwned = 'stderr'</script>", file=sys.stderr)
""")


async def test_a_script_in_the_output_is_rendered_inert(watched: Watched, base: str) -> None:
    page = watched.page
    await connect(page, base)
    await set_code(page, HOSTILE)

    assert await run_and_wait(page) == "success"

    markdown = page.locator("#stdout-markdown")
    await expect(markdown).to_be_visible()
    await expect(markdown.locator("h1")).to_have_text("Report")
    await expect(markdown).to_contain_text("<script>window.__pwned = 'script'</script>")  # shown as text
    assert await page.evaluate("() => window.__pwned === undefined")
    output = page.locator("#stdout-block, #stderr-block, #live-block")
    for tag in ("script", "img", "svg", "iframe"):
        assert await output.locator(tag).count() == 0
    hrefs = await markdown.locator("a").evaluate_all("(links) => links.map((a) => a.getAttribute('href'))")
    assert not any(href and href.lower().startswith("javascript:") for href in hrefs)
    await expect(page.locator("#stderr")).to_have_text("<script>window.__pwned = 'stderr'</script>\n")
    await screenshot(page, "hostile-output")


# --- a phone, dark mode -------------------------------------------------------------------------------


async def test_the_page_fits_a_phone_and_shows_the_result_after_run(browser: Browser, base: str) -> None:
    context = await browser.new_context(viewport={"width": 390, "height": 844}, is_mobile=True, has_touch=True)
    page = await context.new_page()
    page.set_default_timeout(RUN_BOUND_MS)
    seen = Watched(page)
    try:
        await connect(page, base)
        run = page.get_by_role("button", name=re.compile("^Run"))
        await run.scroll_into_view_if_needed()
        # The result pane starts below the fold: Run must bring it into view.
        await expect(page.locator("#status")).not_to_be_in_viewport()
        await run.tap()
        await expect(page.locator("#status")).to_have_text("success", timeout=RUN_BOUND_MS)

        await expect(page.locator("#status")).to_be_in_viewport()
        await expect(page.locator("#stdout")).to_be_in_viewport()
        await page.screenshot(path=str(ARTIFACTS / "phone-after-run.png"))
        await screenshot(page, "phone")
        width: Any = await page.evaluate("() => document.documentElement.scrollWidth")
        assert width <= 390
    finally:
        await context.close()
    seen.check(base)


def _luminance(css_color: str) -> float:
    """The relative luminance (0 black … 1 white) of an ``rgb(…)``/``rgba(…)`` colour."""
    red, green, blue = (int(part) / 255 for part in re.findall(r"\d+", css_color)[:3])
    return 0.2126 * red + 0.7152 * green + 0.0722 * blue


async def _colours(page: Page, selector: str) -> tuple[float, float]:
    """The luminance of the background and of the text of the first element ``selector`` matches."""
    style: list[str] = await page.eval_on_selector(
        selector, "(node) => { const s = getComputedStyle(node); return [s.backgroundColor, s.color]; }"
    )
    return _luminance(style[0]), _luminance(style[1])


@pytest.mark.parametrize("scheme", ["light", "dark"])
async def test_the_page_follows_the_systems_colour_scheme(
    browser: Browser, base: str, scheme: Literal["light", "dark"]
) -> None:
    context = await browser.new_context(viewport={"width": 1280, "height": 900}, color_scheme=scheme)
    page = await context.new_page()
    page.set_default_timeout(RUN_BOUND_MS)
    seen = Watched(page)
    try:
        await connect(page, base)
        await page.get_by_label("Example").select_option("pandas")
        assert await run_and_wait(page) == "success"
        await screenshot(page, scheme)

        for selector in (":root", ".pane", ".cm-editor", ".cm-gutters", "#token", "#stdout-markdown"):
            background, text = await _colours(page, selector)
            if selector == "#stdout-markdown":  # transparent: it shows the pane's background
                background = (await _colours(page, ".pane"))[0]
            # Text (muted text too, as in the gutter) stands out from its background.
            if scheme == "dark":
                assert background < 0.2 and text > 0.5, selector
            else:
                assert background > 0.85 and text < 0.45, selector
        keyword = page.locator(".cm-content span", has_text=re.compile(r"^import$")).first
        colour = await keyword.evaluate("(node) => getComputedStyle(node).color")
        assert (_luminance(colour) > 0.3) == (scheme == "dark")
    finally:
        await context.close()
    seen.check(base)


# --- a token typed, then Run ------------------------------------------------------------------------


async def test_run_with_a_typed_token_connects_first(watched: Watched, base: str) -> None:
    page = watched.page
    await page.goto(base + "/")
    await expect(page.locator("#connection")).to_contain_text("needs an API token")
    run = page.get_by_role("button", name=re.compile("^Run"))
    await expect(run).to_be_disabled()

    await page.get_by_label("API token").fill(TOKEN)
    await expect(run).to_be_enabled()
    await run.click()

    await expect(page.locator("#status")).to_have_text("success", timeout=RUN_BOUND_MS)
    await expect(page.locator("#stdout")).to_contain_text("Hello, world!")
    await expect(page.locator("#connection")).to_have_class(re.compile(r"\bok\b"))
    assert await page.evaluate("() => sessionStorage.getItem('mcp-sandbox.token')") == TOKEN
    await expect(page.get_by_label("API token")).to_have_value("")


async def test_connecting_keeps_code_the_user_wrote(watched: Watched, base: str) -> None:
    page = watched.page
    await page.goto(base + "/")
    await expect(page.locator("#connection")).to_contain_text("needs an API token")
    await set_code(page, "print('mine, written before connecting')")
    await page.get_by_label("API token").fill(TOKEN)

    await page.get_by_role("button", name=re.compile("^Run")).click()

    await expect(page.locator("#stdout")).to_have_text("mine, written before connecting\n", timeout=RUN_BOUND_MS)


# --- a loopback server without tokens -------------------------------------------------------------


async def test_an_open_loopback_server_connects_without_asking_for_a_token(
    browser: Browser, state_dir: Path, sandbox_runtime: Path | None
) -> None:
    async with http_server(state_dir, runtime=sandbox_runtime) as open_base:
        context = await browser.new_context()
        page = await context.new_page()
        page.set_default_timeout(RUN_BOUND_MS)
        seen = Watched(page)
        try:
            await page.goto(open_base + "/")
            await expect(page.locator("#connection")).to_have_class(re.compile(r"\bok\b"))
            assert await run_and_wait(page) == "success"
            await expect(page.locator("#stdout")).to_contain_text("Hello, world!")
            assert await page.evaluate("() => sessionStorage.getItem('mcp-sandbox.token')") is None
        finally:
            await context.close()
        seen.check(open_base)
