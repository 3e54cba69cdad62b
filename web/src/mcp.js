// A small MCP client over Streamable HTTP: JSON-RPC requests POSTed to the server's own MCP
// endpoint with the bearer token, answers read as JSON or as an event stream (where progress
// notifications come before the answer). A call given an AbortSignal is cancelled when it aborts:
// `notifications/cancelled` for its request id (the server then ends the run), and the answer's
// stream is dropped. A tool call may run as a task instead (callToolAsTask, then tasks/get,
// tasks/result and tasks/cancel). The playground has no powers another client lacks.

const PROTOCOL_VERSION = "2025-11-25";

export class McpError extends Error {
  /** @param {string} message @param {{status?: number, code?: number, data?: unknown}} [details] */
  constructor(message, details = {}) {
    super(message);
    this.name = "McpError";
    this.status = details.status;
    this.code = details.code;
    this.data = details.data;
  }
}

/** Cut an event stream into its events' data (a JSON-RPC message each). */
async function* events(body) {
  const reader = body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buffer += value.replace(/\r\n?/g, "\n");
    let end;
    while ((end = buffer.indexOf("\n\n")) >= 0) {
      const event = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      const data = event
        .split("\n")
        .filter((line) => line.startsWith("data:"))
        .map((line) => line.slice(5).replace(/^ /, ""))
        .join("\n");
      if (data) yield data;
    }
  }
}

/** A call its caller cancelled (its AbortSignal aborted): it has no result. */
export class McpCancelled extends McpError {
  constructor(method) {
    super(`${method} was cancelled`);
    this.name = "McpCancelled";
  }
}

function httpProblem(status, text) {
  if (status === 401) return "the server refused the token (401): check it and connect again";
  if (status === 403) return "the server refused this request (403): the token may lack access, or the page's origin is not allowed";
  let detail = text.trim().slice(0, 300);
  try {
    const parsed = JSON.parse(text);
    detail = parsed?.error?.message ?? parsed?.error_description ?? parsed?.error ?? detail;
  } catch {
    // not JSON: the text itself
  }
  return `the server answered HTTP ${status}${detail ? `: ${detail}` : ""}`;
}

export class McpClient {
  /** @param {string} endpoint the MCP URL (same origin) @param {string} token "" for none */
  constructor(endpoint, token) {
    this.endpoint = endpoint;
    this.token = token;
    this.sessionId = null;
    this.nextId = 1;
    this.serverInfo = null;
  }

  headers(extra = {}) {
    const headers = { "Content-Type": "application/json", Accept: "application/json, text/event-stream", ...extra };
    if (this.token) headers.Authorization = `Bearer ${this.token}`;
    if (this.sessionId) headers["Mcp-Session-Id"] = this.sessionId;
    if (this.serverInfo) headers["MCP-Protocol-Version"] = PROTOCOL_VERSION;
    return headers;
  }

  async post(message, signal) {
    let response;
    try {
      response = await fetch(this.endpoint, {
        method: "POST",
        headers: this.headers(),
        body: JSON.stringify(message),
        credentials: "omit",
        cache: "no-store",
        signal,
      });
    } catch (error) {
      if (signal?.aborted) throw error;
      throw new McpError(`cannot reach the server: ${error.message}`);
    }
    if (!response.ok && response.status !== 202) {
      throw new McpError(httpProblem(response.status, await response.text()), { status: response.status });
    }
    return response;
  }

  /** Open the session (initialize, then notifications/initialized). */
  async connect() {
    this.sessionId = null;
    this.serverInfo = null;
    const result = await this.exchange("initialize", {
      protocolVersion: PROTOCOL_VERSION,
      capabilities: {},
      clientInfo: { name: "mcp-sandbox-playground", version: "1" },
    });
    this.serverInfo = result.serverInfo ?? {};
    await this.post({ jsonrpc: "2.0", method: "notifications/initialized" });
    return result;
  }

  /** Send a notification (no answer is awaited beyond the HTTP status). */
  async notify(method, params) {
    await this.post({ jsonrpc: "2.0", method, params });
  }

  /**
   * Send one request; resolve with its result. `onProgress` gets the progress notifications;
   * `signal` (an AbortSignal) cancels the request: it then rejects with McpCancelled.
   */
  async request(method, params, onProgress, signal) {
    try {
      return await this.exchange(method, params, onProgress, signal);
    } catch (error) {
      // The server forgot the session (restarted, or it expired): open a new one, once.
      if (error instanceof McpError && error.status === 404 && this.sessionId && !signal?.aborted) {
        await this.connect();
        return await this.exchange(method, params, onProgress, signal);
      }
      throw error;
    }
  }

  async exchange(method, params, onProgress, signal) {
    if (signal?.aborted) throw new McpCancelled(method);
    const id = this.nextId++;
    const body = { jsonrpc: "2.0", id, method, params: { ...params } };
    if (onProgress) body.params._meta = { progressToken: `playground-${id}` };
    // Registered before the fetch sees the signal: the server hears of the cancel first, then
    // the answer's stream is dropped.
    const cancel = () => {
      const reason = typeof signal.reason === "string" ? signal.reason : "cancelled by the user";
      this.notify("notifications/cancelled", { requestId: id, reason }).catch(() => {});
    };
    signal?.addEventListener("abort", cancel, { once: true });
    try {
      return await this.answer(method, id, body, onProgress, signal);
    } catch (error) {
      if (signal?.aborted) throw new McpCancelled(method);
      throw error;
    } finally {
      signal?.removeEventListener("abort", cancel);
    }
  }

  async answer(method, id, body, onProgress, signal) {
    const response = await this.post(body, signal);
    const session = response.headers.get("Mcp-Session-Id");
    if (session) this.sessionId = session;
    const type = response.headers.get("Content-Type") ?? "";
    let answer = null;
    if (type.startsWith("text/event-stream")) {
      for await (const data of events(response.body)) {
        const message = JSON.parse(data);
        if (message.id === id && ("result" in message || "error" in message)) {
          answer = message;
          break;
        }
        if (message.method === "notifications/progress" && onProgress) onProgress(message.params);
      }
    } else {
      answer = await response.json();
    }
    if (answer === null) throw new McpError(`the server ended the answer to ${method} without a result`);
    if (answer.error) {
      const { code, data } = answer.error;
      throw new McpError(`${method} failed: ${answer.error.message}`, { code, data });
    }
    return answer.result;
  }

  /** End the session on the server (best effort; `keepalive` lets it outlive the page). */
  close() {
    if (!this.sessionId) return;
    const headers = this.headers();
    this.sessionId = null;
    fetch(this.endpoint, { method: "DELETE", headers, keepalive: true, credentials: "omit" }).catch(() => {});
  }

  listTools() {
    return this.request("tools/list", {});
  }

  callTool(name, args, onProgress, signal) {
    return this.request("tools/call", { name, arguments: args }, onProgress, signal);
  }

  /**
   * Start a tools/call as a task (MCP Tasks, the 2025-11-25 design): the server answers at once
   * with the task (its `taskId`, `status`, `pollInterval`), and the run goes on without this request.
   */
  async callToolAsTask(name, args) {
    const created = await this.request("tools/call", { name, arguments: args, task: {} });
    return { ...created.task, _meta: created._meta };
  }

  /** The task now: its status, and while it works its `statusMessage`. */
  getTask(taskId) {
    return this.request("tasks/get", { taskId });
  }

  /** The task's tool result once it ends (the request waits); rejects when it failed or was cancelled. */
  taskResult(taskId) {
    return this.request("tasks/result", { taskId });
  }

  /** Cancel the task: the server ends its run's processes before it answers. */
  cancelTask(taskId) {
    return this.request("tasks/cancel", { taskId });
  }

  readResource(uri) {
    return this.request("resources/read", { uri });
  }
}
