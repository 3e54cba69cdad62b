// The playground: an editor, the run's options, and the result, over the server's own MCP endpoint.
import { javascript } from "@codemirror/lang-javascript";
import { python } from "@codemirror/lang-python";
import { Compartment, EditorState, Prec } from "@codemirror/state";
import { keymap } from "@codemirror/view";
import { basicSetup, EditorView } from "codemirror";

import { editorLook, followColorScheme } from "./editor-theme.js";
import { examplesFor } from "./examples.js";
import { McpClient, McpError } from "./mcp.js";
import {
  element,
  exitCodeText,
  fileRows,
  humanSize,
  problemsOf,
  resultImages,
  setBadge,
  showLive,
  showMarkdown,
  showStdout,
  statusOf,
} from "./result.js";

const TOKEN_KEY = "mcp-sandbox.token";
const CONVERSATIONS_KEY = "mcp-sandbox.conversations";
const MCP_ENDPOINT = new URL("mcp", document.baseURI).pathname;
const UPLOAD_ENDPOINT = new URL("upload", document.baseURI).pathname;
const CONVERSATIONS_ENDPOINT = new URL("conversations", document.baseURI).pathname;
const RENEW_ENDPOINT = new URL("files/renew", document.baseURI).pathname;
const REMEMBERED_CONVERSATIONS = 50;
const LIVE_LINES = 500;
const LANGUAGES = ["python", "typescript", "javascript"];
const NARROW = window.matchMedia("(max-width: 800px)");
const REDUCED_MOTION = window.matchMedia("(prefers-reduced-motion: reduce)");

const $ = (id) => document.getElementById(id);
const ui = {
  auth: $("auth"),
  token: $("token"),
  forget: $("forget"),
  connection: $("connection"),
  language: $("language"),
  example: $("example"),
  run: $("run"),
  stop: $("stop"),
  runStatus: $("run-status"),
  conversation: $("conversation"),
  conversations: $("conversations"),
  newConversation: $("new-conversation"),
  leaveConversation: $("leave-conversation"),
  branchConversation: $("branch-conversation"),
  conversationHelp: $("conversation-help"),
  conversationList: $("conversation-list"),
  conversationListHelp: $("conversation-list-help"),
  refreshConversations: $("refresh-conversations"),
  timeout: $("timeout"),
  networkRow: $("network-row"),
  network: $("network"),
  envRows: $("env-rows"),
  addEnv: $("add-env"),
  resultHeading: $("result-heading"),
  status: $("status"),
  exitCode: $("exit-code"),
  duration: $("duration"),
  place: $("place"),
  error: $("error"),
  notice: $("notice"),
  taskBlock: $("task-block"),
  taskStatus: $("task-status"),
  taskElapsed: $("task-elapsed"),
  taskId: $("task-id"),
  taskOutputRow: $("task-output-row"),
  taskOutput: $("task-output"),
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
  files: $("files"),
  noFiles: $("no-files"),
  drop: $("drop"),
  upload: $("upload"),
  uploadStatus: $("upload-status"),
};

const state = {
  client: null,
  token: sessionStorage.getItem(TOKEN_KEY) ?? "",
  offers: new Set(),
  languages: [],
  running: null, // the run going on (its task, whether Stop was pressed), or null
  files: new Map(),
  forkFrom: null, // the conversation the current one branches from, until the server has made it
  listed: [], // the tenant's conversations the server confirmed, most recently used first
  others: 0, // how many more the tenant has, not named by this tab
  listing: 0, // the number of the last list request (an older answer is dropped)
};

// --- editor ------------------------------------------------------------------------------------

const languageMode = new Compartment();
const modes = {
  python: () => python(),
  typescript: () => javascript({ typescript: true }),
  javascript: () => javascript(),
};

const editor = new EditorView({
  parent: $("editor"),
  state: EditorState.create({
    doc: "",
    extensions: [
      Prec.highest(keymap.of([{ key: "Mod-Enter", run: () => (run(), true) }])),
      basicSetup,
      languageMode.of(python()),
      editorLook(),
      EditorView.contentAttributes.of({ "aria-label": "Code to run" }),
      EditorView.cspNonce.of(document.querySelector('meta[name="csp-nonce"]')?.content ?? ""),
    ],
  }),
});

followColorScheme(editor);

function setCode(code) {
  editor.dispatch({ changes: { from: 0, to: editor.state.doc.length, insert: code } });
}

/** Whether the editor holds nothing of the user's own: empty, or an example as it came. */
function editorUntouched() {
  const doc = editor.state.doc.toString();
  const every = new Set(["servers"]);
  return !doc.trim() || LANGUAGES.some((language) => examplesFor(language, every).some((ex) => ex.code === doc));
}

// --- small helpers -----------------------------------------------------------------------------

function setConnection(text, kind = "") {
  ui.connection.textContent = text;
  ui.connection.className = `connection ${kind}`;
}

function showError(text) {
  ui.error.textContent = text;
  ui.error.hidden = !text;
}

function showNotice(text) {
  ui.notice.textContent = text;
  ui.notice.hidden = !text;
}

/** Run works when connected, or when a token is typed (Run then connects with it first). */
function updateRunButton() {
  const ready = state.client ? state.languages.length > 0 : ui.token.value.trim() !== "";
  ui.run.disabled = Boolean(state.running) || !ready;
}

function randomConversation() {
  const bytes = crypto.getRandomValues(new Uint8Array(6));
  return `playground-${Array.from(bytes, (b) => b.toString(16).padStart(2, "0")).join("")}`;
}

// --- conversations -----------------------------------------------------------------------------

function knownConversations() {
  try {
    const list = JSON.parse(sessionStorage.getItem(CONVERSATIONS_KEY) ?? "[]");
    return Array.isArray(list) ? list.filter((item) => typeof item === "string") : [];
  } catch {
    return [];
  }
}

function listConversations(list = knownConversations()) {
  ui.conversations.replaceChildren(...list.map((item) => element("option", { value: item })));
}

function rememberConversation(id) {
  if (!id) return;
  const list = [id, ...knownConversations().filter((item) => item !== id)].slice(0, REMEMBERED_CONVERSATIONS);
  sessionStorage.setItem(CONVERSATIONS_KEY, JSON.stringify(list));
  listConversations(list);
}

/** Run in conversation `id` from now on ("": in none, each run afresh); its files are fetched. */
function switchConversation(id) {
  ui.conversation.value = id;
  state.forkFrom = null;
  rememberConversation(id);
  state.files = new Map();
  renderFiles();
  describeConversation();
  renderConversationList();
  if (id && state.listed.some((item) => item.conversationId === id)) loadFiles(id);
}

/** Branch: a new conversation whose first run starts from a copy of the current one. */
function branchConversation() {
  const source = ui.conversation.value.trim();
  if (!source) return;
  ui.conversation.value = randomConversation();
  state.forkFrom = source;
  state.files = new Map();
  renderFiles();
  describeConversation();
  renderConversationList();
}

function describeConversation() {
  const id = ui.conversation.value.trim();
  ui.leaveConversation.hidden = !id;
  ui.branchConversation.hidden = !id || Boolean(state.forkFrom);
  if (state.forkFrom && id) {
    ui.conversationHelp.textContent =
      `A branch of ${state.forkFrom}: the next run starts from a copy of its files (and, where its ` +
      "interpreter is live, its Python variables), then runs the code. The two never see each other's " +
      "later writes. Leave, or pick another conversation, to drop the branch.";
    return;
  }
  ui.conversationHelp.textContent = id
    ? "Runs in this conversation keep its files in /workspace and its Python variables. Its first run " +
      "starts an interpreter of its own, so it takes longer. Branch to try something on a copy; " +
      "Leave to run each time afresh."
    : "None: each run takes a fresh, ready sandbox (the fastest) and nothing is kept. Start a " +
      "conversation to keep files in /workspace and Python variables from run to run.";
}

function authorization() {
  return state.token ? { Authorization: `Bearer ${state.token}` } : {};
}

/** Ask the server which of the conversations this tab knows are the tenant's, with their usage. */
async function refreshConversations() {
  if (!state.client) return;
  const asked = ++state.listing;
  ui.refreshConversations.disabled = true;
  try {
    const response = await fetch(CONVERSATIONS_ENDPOINT, {
      method: "POST",
      headers: { "Content-Type": "application/json", ...authorization() },
      body: JSON.stringify({ conversationIds: knownConversations() }),
      credentials: "omit",
      cache: "no-store",
    });
    const answer = await response.json().catch(() => ({}));
    if (!response.ok) throw new Error(answer.error ?? `HTTP ${response.status}`);
    if (asked !== state.listing) return;
    state.listed = Array.isArray(answer.conversations) ? answer.conversations : [];
    state.others = Number(answer.others) || 0;
    // A branch is made once the server has its conversation: later runs need no forkFrom.
    const current = ui.conversation.value.trim();
    if (state.forkFrom && state.listed.some((item) => item.conversationId === current)) {
      state.forkFrom = null;
      describeConversation();
    }
    renderConversationList();
  } catch (error) {
    if (asked === state.listing) ui.conversationListHelp.textContent = `Could not list them: ${error.message}`;
  } finally {
    if (asked === state.listing) ui.refreshConversations.disabled = !state.client;
  }
}

const RELATIVE = new Intl.RelativeTimeFormat(undefined, { numeric: "auto" });

function ago(seconds) {
  const delta = seconds - Date.now() / 1000;
  for (const [unit, size] of [["day", 86400], ["hour", 3600], ["minute", 60]]) {
    if (Math.abs(delta) >= size) return RELATIVE.format(Math.round(delta / size), unit);
  }
  return RELATIVE.format(Math.round(delta), "second");
}

function renderConversationList() {
  const current = ui.conversation.value.trim();
  const body = ui.conversationList.tBodies[0];
  body.replaceChildren(
    ...state.listed.map((item) => {
      const id = item.conversationId;
      const open = element("button", { type: "button", className: "open", textContent: id });
      open.setAttribute("aria-label", id === current ? `${id} (current conversation)` : `Switch to conversation ${id}`);
      open.addEventListener("click", () => {
        switchConversation(id);
        ui.conversation.focus();
      });
      const used = new Date(item.lastUsed * 1000);
      const time = element("time", { dateTime: used.toISOString(), textContent: ago(item.lastUsed), title: used.toLocaleString() });
      const row = element(
        "tr",
        {},
        element("th", { scope: "row" }, open),
        element("td", {}, time),
        element("td", { textContent: String(item.files) }),
        element("td", { textContent: humanSize(item.bytes) }),
      );
      if (id === current) row.setAttribute("aria-current", "true");
      return row;
    }),
  );
  ui.conversationList.hidden = state.listed.length === 0;
  const others = state.others ?? 0;
  const elsewhere = others
    ? ` ${others} more of yours ${others === 1 ? "was" : "were"} used elsewhere (another tab or client): ` +
      "type an id above to open one."
    : "";
  ui.conversationListHelp.textContent = !state.client
    ? "Connect to list them."
    : (state.listed.length ? "" : "None used in this tab yet.") + elsewhere;
}

/** Show conversation `id`'s files (freshly signed links), as the server has them now. */
async function loadFiles(id) {
  try {
    const query = new URLSearchParams({ conversationId: id });
    const response = await fetch(`${RENEW_ENDPOINT}?${query}`, { headers: authorization(), credentials: "omit", cache: "no-store" });
    const answer = await response.json().catch(() => ({}));
    if (!response.ok) throw new Error(answer.error ?? `HTTP ${response.status}`);
    if (ui.conversation.value.trim() !== id) return;
    state.files = new Map((answer.files ?? []).map((file) => [file.name, file]));
    renderFiles();
  } catch (error) {
    if (ui.conversation.value.trim() === id) showError(`Could not list the files of ${id}: ${error.message}`);
  }
}

// --- environment rows --------------------------------------------------------------------------

function addEnvRow(name = "", value = "") {
  const index = ui.envRows.children.length + 1;
  const nameInput = element("input", { value: name, placeholder: "NAME", spellcheck: false, className: "env-name" });
  nameInput.setAttribute("aria-label", `Variable ${index} name`);
  const valueInput = element("input", { value, placeholder: "value", spellcheck: false, className: "env-value" });
  valueInput.setAttribute("aria-label", `Variable ${index} value`);
  const remove = element("button", { type: "button", className: "quiet", textContent: "Remove" });
  remove.setAttribute("aria-label", `Remove variable ${index}`);
  const row = element("div", { className: "env-row" }, nameInput, valueInput, remove);
  remove.addEventListener("click", () => row.remove());
  ui.envRows.append(row);
  return nameInput;
}

function environment() {
  const pairs = [];
  for (const row of ui.envRows.children) {
    const name = row.querySelector(".env-name").value.trim();
    if (name) pairs.push({ name, value: row.querySelector(".env-value").value });
  }
  return pairs;
}

// --- languages and examples --------------------------------------------------------------------

/** List the language's examples; put the first in the editor unless `keepCode` and the user wrote some. */
function fillExamples(keepCode) {
  const examples = examplesFor(ui.language.value, state.offers);
  ui.example.replaceChildren(...examples.map((ex) => element("option", { value: ex.id, textContent: ex.title })));
  ui.example.disabled = examples.length === 0;
  if (examples.length && !(keepCode && !editorUntouched())) setCode(examples[0].code);
}

function chooseLanguage(keepCode = false) {
  const make = modes[ui.language.value] ?? modes.javascript;
  editor.dispatch({ effects: languageMode.reconfigure(make()) });
  fillExamples(keepCode);
}

ui.language.addEventListener("change", () => chooseLanguage());
ui.example.addEventListener("change", () => {
  const example = examplesFor(ui.language.value, state.offers).find((ex) => ex.id === ui.example.value);
  if (!example) return;
  setCode(example.code);
  // Examples about files show their downloads: those live in a conversation.
  if (example.conversation && !ui.conversation.value.trim()) switchConversation(randomConversation());
});

// --- connecting --------------------------------------------------------------------------------

/** Connect with `token` ("" for none); true once connected. */
async function connect(token) {
  const client = new McpClient(MCP_ENDPOINT, token);
  setConnection("Connecting…");
  ui.run.disabled = true;
  try {
    const init = await client.connect();
    const tools = (await client.listTools()).tools ?? [];
    const runners = await client.callTool("list_runners", {});
    const info = runners.structuredContent ?? {};
    state.client?.close();
    state.client = client;
    state.token = token;
    if (token) sessionStorage.setItem(TOKEN_KEY, token);
    configure(tools, info);
    refreshConversations();
    const server = init.serverInfo ?? {};
    setConnection(`Connected to ${server.name ?? "the server"} ${server.version ?? ""}`.trim() + ".", "ok");
    showError("");
    return true;
  } catch (error) {
    state.client = null;
    updateRunButton();
    const message = error instanceof McpError ? error.message : String(error);
    if (error instanceof McpError && error.status === 401 && !token) {
      setConnection("This server needs an API token: enter it above.", "bad");
    } else {
      setConnection(`Not connected: ${message}`, "bad");
      showError(`Could not connect: ${message}`);
    }
    return false;
  }
}

function configure(tools, info) {
  state.offers = new Set();
  if (tools.some((tool) => tool.name === "search_tools")) state.offers.add("servers");
  const runCode = tools.find((tool) => tool.name === "run_code");
  const timeout = runCode?.inputSchema?.properties?.timeout;
  if (typeof timeout?.maximum === "number") {
    ui.timeout.max = String(timeout.maximum);
    ui.timeout.placeholder = `server default (max ${timeout.maximum})`;
  }
  const runners = Array.isArray(info.runners) ? info.runners : [];
  state.languages = runners.filter((runner) => !runner.error).map((runner) => runner.language);
  // Network: only where the server says it can grant it: list_runners' `network` is
  // {available, reaches}, `reaches` saying what `network: true` reaches.
  const offered = info.network;
  const network = offered?.available === true;
  ui.networkRow.hidden = !network;
  ui.networkRow.title = network ? `network: true reaches ${offered.reaches}` : "";
  if (!network) ui.network.checked = false;
  const previous = ui.language.value;
  ui.language.replaceChildren(
    ...runners.map((runner) => {
      const label = `${runner.language}${runner.version ? ` (${runner.runtime} ${runner.version})` : ""}`;
      return element("option", { value: runner.language, textContent: label, disabled: Boolean(runner.error) });
    }),
  );
  ui.language.value = state.languages.includes(previous) ? previous : (state.languages[0] ?? "");
  ui.language.disabled = state.languages.length === 0;
  updateRunButton();
  chooseLanguage(true);
}

ui.auth.addEventListener("submit", (event) => {
  event.preventDefault();
  connect(ui.token.value.trim());
  ui.token.value = "";
});
ui.token.addEventListener("input", updateRunButton);

ui.forget.addEventListener("click", () => {
  sessionStorage.removeItem(TOKEN_KEY);
  state.client?.close();
  state.client = null;
  state.token = "";
  state.listed = [];
  state.others = 0;
  renderConversationList();
  ui.refreshConversations.disabled = true;
  updateRunButton();
  setConnection("Token forgotten. Not connected.");
});

// --- running -----------------------------------------------------------------------------------

function resetResult() {
  showError("");
  showNotice("");
  ui.exitCode.textContent = "";
  ui.duration.textContent = "";
  ui.place.textContent = "";
  ui.live.textContent = "";
  ui.liveBlock.hidden = true;
  ui.taskBlock.hidden = true;
  for (const block of [ui.stdoutBlock, ui.stderrBlock, ui.imagesBlock]) block.hidden = true;
  ui.images.replaceChildren();
}

function setStatus(status, label = status) {
  setBadge(ui.status, status, label);
}

/** A fork's compact account (what was carried, what was skipped), as `key: value` pairs. */
function describeFork(fork) {
  if (!fork || typeof fork !== "object") return "";
  const shown = (value) => (Array.isArray(value) ? value.join(", ") || "none" : String(value));
  return Object.entries(fork)
    .filter(([, value]) => (value !== null && typeof value !== "object") || Array.isArray(value))
    .map(([key, value]) => `${key}: ${shown(value)}`)
    .join("; ");
}

/** Where a run ran, as the result says: in no conversation, or in one's kept or new interpreter. */
function describePlace(conversation, session, forkFrom, fork) {
  if (!conversation) return "no conversation: a fresh sandbox, nothing kept";
  if (forkFrom && fork) {
    const account = describeFork(fork);
    return `conversation: a branch of ${forkFrom}${account ? ` (${account})` : ""}`;
  }
  if (session === "kept") return "conversation: variables kept";
  if (session === "new") return "conversation: a new interpreter";
  return "conversation";
}

/** On a narrow screen the result is far below Run: bring it into view. */
function revealResult() {
  if (!NARROW.matches) return;
  ui.resultHeading.scrollIntoView({ block: "start", behavior: REDUCED_MOTION.matches ? "auto" : "smooth" });
}

/** "12 s", "3 min 4 s": how long a run has lasted. */
function humanElapsed(ms) {
  const whole = Math.floor(ms / 1000);
  return whole < 60 ? `${whole} s` : `${Math.floor(whole / 60)} min ${whole % 60} s`;
}

/** Show the run's task as the server last said it: its status, and while it works its last output line. */
function showTask(task) {
  ui.taskBlock.hidden = false;
  setBadge(ui.taskStatus, task.status);
  ui.taskId.textContent = task.taskId;
  const line = task._meta?.["mcp-sandbox/lastOutput"];
  ui.taskOutput.textContent = typeof line === "string" ? line : "";
  ui.taskOutputRow.hidden = task.status !== "working" || typeof line !== "string";
}

function tickElapsed(running) {
  ui.taskElapsed.textContent = humanElapsed(performance.now() - running.started);
}

const pause = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

/**
 * While the run lasts, ask for its task every poll interval (tasks/get: status, last output
 * line) and for its view's state (the last lines of output); a run that outlasts the first
 * interval is shown as the task it is, its elapsed time ticking.
 */
async function watchTask(running, task) {
  const interval = Math.max(250, task.pollInterval ?? 1000);
  const view = task._meta?.ui?.resourceUri;
  while (!running.over) {
    await pause(interval);
    if (running.over) return;
    try {
      const [seen, read] = await Promise.all([
        state.client.getTask(task.taskId),
        view ? state.client.readResource(`${view}/state`).catch(() => null) : null,
      ]);
      if (running.over) return;
      showTask(seen);
      tickElapsed(running);
      running.ticker ??= setInterval(() => tickElapsed(running), 1000);
      const text = read?.contents?.[0]?.text;
      const runState = text ? JSON.parse(text) : null;
      if (runState?.status === "running") showLive(ui, runState, LIVE_LINES);
    } catch {
      // The next poll asks again; tasks/result says how the run ended.
    }
  }
}

async function run() {
  if (state.running) return;
  const typed = ui.token.value.trim();
  if (typed) {
    // A token typed but not yet used: connect with it first (as Connect would), then run.
    ui.token.value = "";
    if (!(await connect(typed))) return;
  } else if (!state.client) {
    showError("Connect first: enter the API token above.");
    ui.token.focus();
    return;
  }
  const conversation = ui.conversation.value.trim();
  const args = { code: editor.state.doc.toString(), language: ui.language.value, environment: environment() };
  if (conversation) args.conversationId = conversation;
  const forkFrom = conversation && state.forkFrom && state.forkFrom !== conversation ? state.forkFrom : null;
  if (forkFrom) args.forkFrom = forkFrom;
  if (ui.timeout.value) args.timeout = Number(ui.timeout.value);
  if (!ui.networkRow.hidden && ui.network.checked) args.network = true;
  // The run goes on as a task: the page polls it, and Stop cancels it (tasks/cancel).
  const running = { taskId: null, stopRequested: false, stopping: null, over: false, ticker: null, started: performance.now() };
  state.running = running;
  updateRunButton();
  ui.stop.hidden = false;
  ui.stop.disabled = false;
  resetResult();
  setStatus("running", "running…");
  ui.runStatus.textContent = "Running…";
  const elapsed = () => `${Math.round(performance.now() - running.started)} ms`;
  try {
    const task = await state.client.callToolAsTask("run_code", args);
    running.taskId = task.taskId;
    if (running.stopRequested) cancelTask(running);
    watchTask(running, task);
    let result;
    try {
      result = await state.client.taskResult(task.taskId);
    } finally {
      running.over = true;
    }
    if (!ui.taskBlock.hidden) showTask({ ...task, status: "completed" });
    if (conversation) rememberConversation(conversation);
    showResult(result, conversation, forkFrom);
  } catch (error) {
    running.over = true;
    ui.duration.textContent = elapsed();
    // Stopped: the cancel's answer says the task's end (null: it had ended before the cancel came).
    const stopped = running.stopping ? await running.stopping : null;
    ui.liveBlock.hidden = true;
    if (stopped?.status === "cancelled") {
      showTask(stopped);
      setStatus("cancelled");
      showNotice(
        "Stopped: the task was cancelled and its sandbox killed." +
          (conversation ? " Files written before stay; its variables are gone (the next run starts a new interpreter)." : ""),
      );
    } else {
      if (running.taskId && !ui.taskBlock.hidden) showTask({ taskId: running.taskId, status: error.data?.status ?? "failed" });
      setStatus("error", "failed");
      showError(error instanceof McpError ? error.message : String(error));
      if (error instanceof McpError && error.status === 401) setConnection("The token was refused: enter it again.", "bad");
    }
  } finally {
    clearInterval(running.ticker);
    if (!ui.taskBlock.hidden) tickElapsed(running);
    state.running = null;
    ui.stop.hidden = true;
    updateRunButton();
    ui.runStatus.textContent = `${ui.status.textContent}${ui.duration.textContent ? ` in ${ui.duration.textContent}` : ""}`;
    revealResult();
    if (conversation) refreshConversations();
  }
}

/** Ask the server to cancel the run's task; its answer (the task, or null) is kept for run() to show. */
function cancelTask(running) {
  running.stopping = state.client.cancelTask(running.taskId).catch((error) => {
    showError(`Could not stop the run: ${error.message}`);
    return null;
  });
}

function stop() {
  const running = state.running;
  if (!running || running.stopRequested) return;
  running.stopRequested = true;
  ui.stop.disabled = true;
  ui.runStatus.textContent = "Stopping…";
  if (running.taskId) cancelTask(running); // else as soon as the task's handle comes
}

function showResult(result, conversation, forkFrom) {
  const data = result.structuredContent ?? {};
  setStatus(statusOf(result));
  ui.liveBlock.hidden = true;
  ui.exitCode.textContent = exitCodeText(data);
  ui.duration.textContent = typeof data.durationMs === "number" ? `${data.durationMs} ms` : "";
  if (data.status !== "validation_error") ui.place.textContent = describePlace(conversation, data.session, forkFrom, data.fork);
  showError(problemsOf(result).join("\n"));
  showStdout(ui, data.stdout ?? "");
  ui.stderr.textContent = data.stderr ?? "";
  ui.stderrBlock.hidden = !data.stderr;
  const images = resultImages(result);
  ui.images.replaceChildren(...images);
  ui.imagesBlock.hidden = images.length === 0;
  if (Array.isArray(data.files)) {
    state.files = new Map(data.files.map((file) => [file.name, file]));
    renderFiles();
  }
}

ui.toggleMarkdown.addEventListener("click", () => showMarkdown(ui, ui.stdoutMarkdown.hidden));
ui.run.addEventListener("click", run);
ui.stop.addEventListener("click", stop);
document.addEventListener("keydown", (event) => {
  if (event.key === "Enter" && (event.ctrlKey || event.metaKey) && !editor.hasFocus) {
    event.preventDefault();
    run();
  }
});

// --- files -------------------------------------------------------------------------------------

function renderFiles() {
  const body = ui.files.tBodies[0];
  const files = [...state.files.values()];
  body.replaceChildren(...fileRows(files));
  ui.files.hidden = files.length === 0;
  ui.noFiles.hidden = files.length > 0;
  ui.noFiles.textContent = ui.conversation.value.trim()
    ? "No files yet."
    : "No conversation: files a run writes are not kept. Uploading starts a conversation.";
}

async function upload(fileList) {
  const files = [...fileList];
  if (!files.length) return;
  if (!state.client) {
    showError("Connect first: enter the API token above.");
    return;
  }
  if (state.forkFrom) {
    showError(`This branch of ${state.forkFrom} is made by its first run: run once, then upload.`);
    return;
  }
  let conversation = ui.conversation.value.trim();
  if (!conversation) {
    conversation = randomConversation();
    switchConversation(conversation);
  }
  const form = new FormData();
  form.append("conversationId", conversation);
  for (const file of files) form.append("file", file, file.name);
  ui.uploadStatus.textContent = `Uploading ${files.length} file(s)…`;
  try {
    const response = await fetch(UPLOAD_ENDPOINT, { method: "POST", body: form, headers: authorization(), credentials: "omit" });
    const answer = await response.json().catch(() => ({}));
    if (!response.ok) throw new Error(answer.error ?? `HTTP ${response.status}`);
    for (const file of answer.files ?? []) state.files.set(file.name, file);
    renderFiles();
    rememberConversation(conversation);
    refreshConversations();
    ui.uploadStatus.textContent = `Uploaded ${files.map((f) => f.name).join(", ")} to /workspace.`;
  } catch (error) {
    ui.uploadStatus.textContent = "Upload failed.";
    showError(`Upload failed: ${error.message}`);
  }
}

ui.upload.addEventListener("change", () => {
  upload(ui.upload.files);
  ui.upload.value = "";
});
ui.drop.addEventListener("dragover", (event) => {
  event.preventDefault();
  ui.drop.classList.add("over");
});
ui.drop.addEventListener("dragleave", () => ui.drop.classList.remove("over"));
ui.drop.addEventListener("drop", (event) => {
  event.preventDefault();
  ui.drop.classList.remove("over");
  upload(event.dataTransfer?.files ?? []);
});

ui.newConversation.addEventListener("click", () => switchConversation(randomConversation()));
ui.leaveConversation.addEventListener("click", () => switchConversation(""));
ui.branchConversation.addEventListener("click", branchConversation);
ui.refreshConversations.addEventListener("click", refreshConversations);
ui.conversation.addEventListener("change", () => switchConversation(ui.conversation.value.trim()));
ui.addEnv.addEventListener("click", () => addEnvRow().focus());

window.addEventListener("pagehide", () => state.client?.close());

// --- start -------------------------------------------------------------------------------------

// No conversation to start with: a run then takes the warm path; one is a choice (New, or an earlier one).
setCode(examplesFor("python", new Set())[0].code);
listConversations();
switchConversation("");
renderConversationList();
addEnvRow();
renderFiles();
connect(state.token);
