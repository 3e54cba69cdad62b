/**
 * Code mode inside a JavaScript/TypeScript sandbox: the global `mcp`, mirroring Python's API.
 *
 * - `mcp.servers.<alias>.<tool>(args)`: call a tool of a server this run may call (its wire name,
 *   or the Python name the host also accepts); the typings are in /tools/<alias>/index.d.ts;
 * - `mcp.runtime`: callTool, listServers, discoveredServers, describeServer, listTools,
 *   searchTools, queryToolDocs; `mcp.MCPError` is what every failed call rejects with;
 * - the tenant's library, which only the host writes: `mcp.runtime.saveTool(fn)` keeps a
 *   function's source for later runs, which call it as `await mcp.saved.<name>(...)`;
 *   saveMemory / loadMemory / listMemories / deleteMemory keep JSON values between runs.
 *
 * Every request goes to the host, which decides what this run may reach. A tool's result is its
 * structuredContent when it has one; otherwise its content: text (parsed when it is a JSON object
 * or array), or Media / Resource / ResourceLink objects; one value for one block, an array for several.
 */

import type { Body } from "./frames.ts";

export interface Requester {
  request(op: string, body: Body): Promise<Body>;
}

export type Detail = "name" | "summary" | "full";

/** A tool call or request failed; `kind` is tool, denied, unavailable or invalid. */
export class MCPError extends Error {
  override name = "MCPError";
  readonly server: string | null;
  readonly tool: string | null;
  readonly kind: string;
  readonly detail: string;

  constructor(message: string, options: { server?: string | null; tool?: string | null; kind?: string } = {}) {
    const where = [options.server, options.tool].filter(Boolean).join(".");
    super(where ? `${where}: ${message}` : message);
    this.server = options.server ?? null;
    this.tool = options.tool ?? null;
    this.kind = options.kind ?? "tool";
    this.detail = message;
  }
}

function base64Bytes(text: string): Uint8Array {
  const binary = atob(text);
  const bytes = new Uint8Array(binary.length);
  for (let index = 0; index < binary.length; index++) bytes[index] = binary.charCodeAt(index);
  return bytes;
}

/** An image or audio clip a tool returned. */
export class Media {
  constructor(
    readonly kind: "image" | "audio",
    readonly mimeType: string,
    readonly data: Uint8Array,
  ) {}
}

/** A resource embedded in a tool result: `text` or `blob`, as the server sent it. */
export class Resource {
  constructor(
    readonly uri: string,
    readonly mimeType: string | null,
    readonly text: string | null,
    readonly blob: Uint8Array | null,
  ) {}
}

/** A link to a resource the server can serve (not its content). */
export class ResourceLink {
  constructor(
    readonly uri: string,
    readonly name: string,
    readonly description: string | null,
    readonly mimeType: string | null,
  ) {}
}

function text(value: string): unknown {
  const stripped = value.trim();
  if (stripped.startsWith("{") || stripped.startsWith("[")) {
    try {
      return JSON.parse(stripped);
    } catch {
      // not JSON after all: the text as it is
    }
  }
  return value;
}

function str(value: unknown): string {
  return typeof value === "string" ? value : "";
}

function block(raw: Record<string, unknown>): unknown {
  switch (raw.type) {
    case "text":
      return text(str(raw.text));
    case "image":
    case "audio":
      return new Media(raw.type, str(raw.mimeType), base64Bytes(str(raw.data)));
    case "resource": {
      const inner = (raw.resource ?? {}) as Record<string, unknown>;
      const blob = typeof inner.blob === "string" ? base64Bytes(inner.blob) : null;
      const body = typeof inner.text === "string" ? inner.text : null;
      return new Resource(str(inner.uri), typeof inner.mimeType === "string" ? inner.mimeType : null, body, blob);
    }
    case "resource_link":
      return new ResourceLink(
        str(raw.uri),
        str(raw.name),
        typeof raw.description === "string" ? raw.description : null,
        typeof raw.mimeType === "string" ? raw.mimeType : null,
      );
    default:
      return raw;
  }
}

function shape(result: Record<string, unknown>, raw: boolean, server: string, tool: string): unknown {
  try {
    const content = Array.isArray(result.content) ? result.content : [];
    const blocks = content.filter((item) => typeof item === "object" && item !== null).map((item) => block(item));
    if (raw) return { structuredContent: result.structuredContent ?? null, content: blocks };
    if (result.structuredContent !== undefined && result.structuredContent !== null) return result.structuredContent;
    if (!blocks.length) return null;
    return blocks.length === 1 ? blocks[0] : blocks;
  } catch (error) {
    // e.g. image data that is not base64
    throw new MCPError(`the server sent a malformed result: ${String(error)}`, { server, tool, kind: "invalid" });
  }
}

function unwrap(reply: Body, server: string | null, tool: string | null): unknown {
  if (reply.ok === true) return reply.result;
  const error = (reply.error ?? {}) as Record<string, unknown>;
  throw new MCPError(typeof error.message === "string" ? error.message : "the host refused the request", {
    server: typeof error.server === "string" ? error.server : server,
    tool,
    kind: typeof error.kind === "string" ? error.kind : "tool",
  });
}

export interface Runtime {
  callTool(server: string, tool: string, args?: Record<string, unknown>, options?: { raw?: boolean }): Promise<unknown>;
  listServers(): Promise<{ name: string; alias: string; tools: number | null }[]>;
  discoveredServers(): Promise<{ name: string; alias: string; allowed: boolean }[]>;
  describeServer(name: string): Promise<Record<string, unknown>>;
  listTools(server: string): Promise<{ name: string; python_name: string; summary: string }[]>;
  searchTools(
    query: string,
    options?: { detail?: Detail; limit?: number },
  ): Promise<{ server: string; tool: string; python_name: string; doc: string }[]>;
  queryToolDocs(server: string, tool?: string | null, detail?: Detail): Promise<string>;
  saveTool(fn: (...args: never[]) => unknown, options?: { name?: string; description?: string }): Promise<string>;
  listSavedTools(): Promise<{ name: string; language: string; description: string }[]>;
  deleteTool(name: string): Promise<boolean>;
  saveMemory(key: string, value: unknown): Promise<void>;
  loadMemory(key: string, fallback?: unknown): Promise<unknown>;
  listMemories(): Promise<string[]>;
  deleteMemory(key: string): Promise<boolean>;
}

export type SavedFunction = (...args: unknown[]) => Promise<unknown>;

export type ToolFunction = (args?: Record<string, unknown>) => Promise<unknown>;

export interface Api {
  runtime: Runtime;
  servers: Record<string, Record<string, ToolFunction>>;
  saved: Record<string, SavedFunction>;
  MCPError: typeof MCPError;
  Media: typeof Media;
  Resource: typeof Resource;
  ResourceLink: typeof ResourceLink;
}

/**
 * The `mcp` global of a run that may call `servers` (aliases) through `host`. With `wholeResults`
 * (the server's tool_results setting is `raw`), a tool call without `{ raw: true }` returns the
 * whole result as the server sent it: `{ content, structuredContent?, isError }`.
 */
export function createApi(host: Requester, servers: string[], options: { wholeResults?: boolean } = {}): Api {
  const wholeResults = options.wholeResults === true;
  const ask = async (op: string, body: Body, server: string | null = null, tool: string | null = null) => {
    let reply: Body;
    try {
      reply = await host.request(op, body);
    } catch (error) {
      throw new MCPError((error as Error).message, { server, tool, kind: "unavailable" });
    }
    return unwrap(reply, server, tool);
  };
  const runtime: Runtime = {
    async callTool(server, tool, args = {}, options = {}) {
      if (options.raw !== true && wholeResults) {
        const whole = (await ask("call_tool", { server, tool, arguments: args, raw: true }, server, tool)) ?? {};
        return { isError: false, ...(whole as Record<string, unknown>) };
      }
      const result = await ask("call_tool", { server, tool, arguments: args }, server, tool);
      return shape((result ?? {}) as Record<string, unknown>, options.raw === true, server, tool);
    },
    listServers: async () => (await ask("list_servers", {})) as Awaited<ReturnType<Runtime["listServers"]>>,
    discoveredServers: async () =>
      (await ask("discovered_servers", {})) as Awaited<ReturnType<Runtime["discoveredServers"]>>,
    describeServer: async (name) => (await ask("describe_server", { server: name }, name)) as Record<string, unknown>,
    listTools: async (server) =>
      (await ask("list_tools", { server }, server)) as Awaited<ReturnType<Runtime["listTools"]>>,
    searchTools: async (query, options = {}) =>
      (await ask("search_tools", {
        query,
        detail: options.detail ?? "summary",
        limit: options.limit ?? 10,
      })) as Awaited<ReturnType<Runtime["searchTools"]>>,
    queryToolDocs: async (server, tool = null, detail = "summary") =>
      (await ask("query_tool_docs", { server, tool, detail }, server, tool)) as string,
    async saveTool(fn, options = {}) {
      const name = options.name ?? fn.name;
      const body = { name, source: fn.toString(), language: "javascript", description: options.description ?? "" };
      await ask("save_tool", body);
      return `Tool '${name}' saved: later runs call it as await mcp.saved.${name}(...).`;
    },
    listSavedTools: async () => (await ask("list_saved_tools", {})) as Awaited<ReturnType<Runtime["listSavedTools"]>>,
    deleteTool: async (name) => (await ask("delete_tool", { name })) === true,
    saveMemory: async (key, value) => {
      await ask("save_memory", { key, value });
    },
    async loadMemory(key, fallback = undefined) {
      const found = (await ask("load_memory", { key })) as { found: boolean; value: unknown };
      return found.found ? found.value : fallback;
    },
    listMemories: async () => (await ask("list_memories", {})) as string[],
    deleteMemory: async (key) => (await ask("delete_memory", { key })) === true,
  };
  // A saved tool is its source, evaluated on first use in a run (the host keeps it; only it writes).
  const loaded = new Map<string, (...args: unknown[]) => unknown>();
  const load = async (name: string) => {
    const cached = loaded.get(name);
    if (cached !== undefined) return cached;
    const found = (await ask("load_tool", { name })) as { language: string; source: string } | null;
    if (found === null || found.language === "python") {
      throw new MCPError(`no saved JavaScript tool '${name}' (mcp.runtime.listSavedTools() lists them)`, {
        kind: "invalid",
      });
    }
    const fn = (0, eval)(`(${found.source})`) as (...args: unknown[]) => unknown;
    loaded.set(name, fn);
    return fn;
  };
  const saved = new Proxy({} as Record<string, SavedFunction>, {
    get: (_target, name) => {
      if (typeof name !== "string" || name === "then") return undefined;
      return async (...args: unknown[]) => (await load(name))(...args);
    },
  });
  // Any property is a tool: the host knows the server's tools, and says so when one is missing.
  const toolsOf = (alias: string) =>
    new Proxy({} as Record<string, ToolFunction>, {
      get: (_target, tool) => {
        if (typeof tool !== "string" || tool === "then") return undefined; // not a thenable
        return (args: Record<string, unknown> = {}) => runtime.callTool(alias, tool, args);
      },
    });
  const bound: Record<string, Record<string, ToolFunction>> = {};
  for (const alias of servers) bound[alias] = toolsOf(alias);
  // The run's servers are its keys; another name still reaches the host, which says why it is denied.
  const serverProxy = new Proxy(bound, {
    get: (target, alias) => {
      if (typeof alias !== "string" || alias === "then") return undefined;
      return target[alias] ?? toolsOf(alias);
    },
    set: () => false,
    deleteProperty: () => false,
  });
  return {
    runtime,
    servers: serverProxy,
    saved,
    MCPError,
    Media,
    Resource,
    ResourceLink,
  };
}
