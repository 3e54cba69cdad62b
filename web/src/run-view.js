// The run's MCP Apps view (ui://mcp-sandbox/run): a run's status, time, output, plots and files, in
// the host's chat. It talks only to its host, through the App SDK (@modelcontextprotocol/ext-apps):
// the host hands it the tool's arguments and result; it reads the run's state through the host
// (resources/read of ui://mcp-sandbox/run/<id>/state) while the run lasts, stops it (tools/call
// with _meta["mcp-sandbox/stop"]) and runs it again (tools/call with the same arguments). The
// server may put a run's state in the page (ui://mcp-sandbox/run/<id>): it is shown before the
// host answers at all. It fetches nothing itself, and holds no token.
import { App, PostMessageTransport, applyDocumentTheme, applyHostStyleVariables } from "@modelcontextprotocol/ext-apps";

import {
  exitCodeText,
  fileRows,
  problemsOf,
  resultImages,
  setBadge,
  showLive,
  showMarkdown,
  showStdout,
  statusOf,
} from "./result.js";

const VIEW_URI = "ui://mcp-sandbox/run";
const STOP_META = "mcp-sandbox/stop";
const STOPPED = "stopped from the run's view"; // the server's error for a run its view stopped
const POLL_MS = 500;
const LIVE_LINES = 500;

const $ = (id) => document.getElementById(id);
const ui = {
  status: $("status"),
  elapsed: $("elapsed"),
  exitCode: $("exit-code"),
  what: $("what"),
  stop: $("stop"),
  again: $("again"),
  error: $("error"),
  liveBlock: $("live-block"),
  live: $("live"),
  stdoutBlock: $("stdout-block"),
  stdout: $("stdout"),
  stdoutMarkdown: $("stdout-markdown"),
  toggleMarkdown: $("toggle-markdown"),
  stderrBlock: $("stderr-block"),
  stderr: $("stderr"),
  imagesBlock: $("images-block"),
  images: $("images"),
  filesBlock: $("files-block"),
  files: $("files"),
};

const state = {
  id: null, // the run's view id, once known
  tool: "run_python",
  arguments: null, // what Run again repeats
  running: false,
  started: 0, // performance.now() at the run's start, as far as this page knows it
  poll: null,
  call: null, // the AbortController of a Run again in flight
  connected: false,
};

const app = new App({ name: "mcp-sandbox run view", version: "1" }, {}, { autoResize: true });

function showError(text) {
  ui.error.textContent = text;
  ui.error.hidden = !text;
}

function describe() {
  const args = state.arguments ?? {};
  const language = state.tool === "run_code" ? (args.language ?? "") : "python";
  const conversation = args.conversationId ? ` in ${args.conversationId}` : "";
  ui.what.textContent = `${language}${conversation}`;
}

function setRunning(running) {
  state.running = running;
  ui.stop.hidden = !running;
  ui.stop.disabled = false;
  ui.again.hidden = running || !state.arguments?.code;
  if (running) setBadge(ui.status, "running", "running…");
}

function tick() {
  if (state.running) ui.elapsed.textContent = `${((performance.now() - state.started) / 1000).toFixed(1)} s`;
}
setInterval(tick, 100);

function clearResult() {
  showError("");
  ui.exitCode.textContent = "";
  for (const block of [ui.stdoutBlock, ui.stderrBlock, ui.imagesBlock, ui.filesBlock, ui.liveBlock]) block.hidden = true;
  ui.live.textContent = "";
  ui.images.replaceChildren();
}

/** The view id a result links (its _meta.ui.resourceUri), or null. */
function linkedId(result) {
  const uri = result?._meta?.ui?.resourceUri ?? "";
  return uri.startsWith(`${VIEW_URI}/`) ? uri.slice(VIEW_URI.length + 1) : null;
}

/** Show a tool result (CallToolResult) of the run. */
function showResult(result) {
  stopPolling();
  state.id = linkedId(result) ?? state.id;
  const data = result.structuredContent ?? {};
  clearResult();
  setRunning(false);
  if (data.error?.startsWith(STOPPED)) setBadge(ui.status, "cancelled", "stopped");
  else setBadge(ui.status, statusOf(result));
  ui.elapsed.textContent = typeof data.durationMs === "number" ? `${(data.durationMs / 1000).toFixed(2)} s` : "";
  ui.exitCode.textContent = exitCodeText(data);
  showError(problemsOf(result).join("\n"));
  showStdout(ui, data.stdout ?? "");
  ui.stderr.textContent = data.stderr ?? "";
  ui.stderrBlock.hidden = !data.stderr;
  const images = resultImages(result);
  ui.images.replaceChildren(...images);
  ui.imagesBlock.hidden = images.length === 0;
  const files = Array.isArray(data.files) ? data.files : [];
  ui.files.tBodies[0].replaceChildren(...fileRows(files, openLink));
  ui.filesBlock.hidden = files.length === 0;
  describe();
}

/** Show a run's state as the server keeps it (running: its last lines; ended: its result). */
function showState(run) {
  state.id = run.id;
  state.tool = run.tool ?? state.tool;
  state.arguments = run.arguments ?? state.arguments;
  if (run.status === "ended" && run.result) {
    showResult(run.result);
    return;
  }
  if (!state.running) {
    clearResult();
    state.started = performance.now() - (run.elapsedMs ?? 0);
    setRunning(true);
  }
  describe();
  showLive(ui, run, LIVE_LINES);
  tick();
  startPolling();
}

// The sandboxed page cannot open a window itself: the host opens the (signed) download link.
function openLink(file, event) {
  if (!state.connected) return;
  event.preventDefault();
  app.openLink({ url: file.url }).catch((error) => showError(`Could not open ${file.name}: ${error.message}`));
}

async function pollOnce() {
  if (!state.id || !state.running || state.call) return;
  try {
    const read = await app.readServerResource({ uri: `${VIEW_URI}/${state.id}/state` });
    const text = read.contents?.[0]?.text;
    if (text && !state.call) showState(JSON.parse(text));
  } catch (error) {
    stopPolling();
    showError(`Lost the run: ${error.message}`);
  }
}

function startPolling() {
  if (state.poll || !state.connected) return;
  state.poll = setInterval(pollOnce, POLL_MS);
}

function stopPolling() {
  clearInterval(state.poll);
  state.poll = null;
}

async function stop() {
  ui.stop.disabled = true;
  if (state.call) {
    state.call.abort("stopped from the run's view"); // the host cancels the call: the server kills the run
    return;
  }
  try {
    await app.callServerTool({ name: state.tool, arguments: {}, _meta: { [STOP_META]: state.id } });
    await pollOnce();
  } catch (error) {
    showError(`Could not stop the run: ${error.message}`);
    ui.stop.disabled = false;
  }
}

async function runAgain() {
  if (state.running || !state.arguments?.code) return;
  const call = new AbortController();
  state.call = call;
  clearResult();
  state.started = performance.now();
  setRunning(true);
  try {
    showResult(await app.callServerTool({ name: state.tool, arguments: state.arguments }, { signal: call.signal }));
  } catch (error) {
    setRunning(false);
    if (call.signal.aborted) {
      setBadge(ui.status, "cancelled");
      showError("Stopped: the run was cancelled and its sandbox killed.");
    } else {
      setBadge(ui.status, "error", "failed");
      showError(error.message ?? String(error));
    }
  } finally {
    state.call = null;
  }
}

function followHost(context) {
  if (context?.theme) applyDocumentTheme(context.theme);
  if (context?.styles?.variables) applyHostStyleVariables(context.styles.variables);
}

ui.toggleMarkdown.addEventListener("click", () => showMarkdown(ui, ui.stdoutMarkdown.hidden));
ui.stop.addEventListener("click", stop);
ui.again.addEventListener("click", runAgain);

app.ontoolinput = ({ arguments: args }) => {
  if (!args) return;
  state.arguments = args;
  if (!state.id) {
    state.started = performance.now();
    setRunning(true);
  }
  describe();
};
app.ontoolresult = (result) => {
  if (!state.call) showResult(result);
};
app.ontoolcancelled = ({ reason }) => {
  stopPolling();
  setRunning(false);
  setBadge(ui.status, "cancelled");
  showError(reason ? `Cancelled: ${reason}` : "Cancelled.");
};
app.onhostcontextchanged = followHost;
app.onteardown = async () => {
  stopPolling();
  return {};
};

// First paint: what the server put in the page, before the host has said anything.
const embedded = JSON.parse($("run-data").textContent || "null");
if (embedded) showState(embedded);
else setRunning(false);

app
  .connect(new PostMessageTransport(window.parent, window.parent))
  .then(() => {
    state.connected = true;
    followHost(app.getHostContext());
    const tool = app.getHostContext()?.toolInfo?.tool?.name;
    if (tool === "run_python" || tool === "run_code") state.tool = tool;
    if (state.running && state.id) startPolling();
  })
  .catch((error) => showError(`The host did not answer: ${error.message}`));
