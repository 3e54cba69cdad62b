/**
 * The runner inside a JavaScript/TypeScript sandbox: `bun|deno ... <entry> LANGUAGE CHANNEL_FD`.
 *
 * It speaks the Python runner's protocol (frames.ts): READY, then one EXEC frame, whose stdout and
 * stderr pipes arrive as SCM_RIGHTS on the channel socket (read with recvmsg through FFI, see
 * libc.ts) and are dup2'ed onto fds 1 and 2. The code is written to a module file and imported:
 * TypeScript is run by the runtime's own transpiler, top-level `await` works, and stack traces
 * show the user's file and lines. While the code waits on tool calls (CALL/REPLY), the channel is
 * read asynchronously; otherwise nothing keeps the process alive but the code's own work.
 *
 * A run ends as a Node.js script does: when its event loop is empty (timers and promises the code
 * left running still run), at process.exit(n) (exit code n), or at an uncaught exception or
 * unhandled rejection (exit code 1, its stack on stderr). DONE carries the exit code, then the
 * process exits with it. One EXEC per process: each JavaScript run gets a fresh sandbox.
 */

import { dup2, receive, writeAll } from "./libc.ts";
import { type Body, DEFAULT_MAX_FRAME, encode, FrameError, FrameParser, HEADER_SIZE, Kind } from "./frames.ts";
import { createApi, type Requester } from "./mcp.ts";
import type { AsyncReader, Platform } from "./platform.ts";

export const EXIT_USAGE = 64;
export const EXIT_PROTOCOL = 76;
const CHUNK = 1 << 16;
const MAX_CHUNK = 1 << 20;
const CODE_DIR = "/tmp/.mcp-sandbox";
// Packages installed at run time (`bun add` in /workspace) go to the conversation's workspace. A
// bare import in the code (CODE_DIR/main.ts) looks in CODE_DIR/node_modules first, which links
// there, then in /node_modules (the runtime's packages): the workspace's packages come first.
const WORKSPACE_PACKAGES = "/workspace/node_modules";
const RUNTIME_DIR = new URL(".", import.meta.url).pathname;

type Command = [Kind, Body, number[]];
type Pending = { resolve: (body: Body) => void; reject: (error: Error) => void };

export class HostUnavailable extends Error {
  override name = "HostUnavailable";
}

/** The sandbox's end of the channel: blocking reads of commands, asynchronous reads of replies. */
export class Connection implements Requester {
  private readonly parser = new FrameParser(DEFAULT_MAX_FRAME);
  private readonly pending = new Map<number, Pending>();
  private fds: number[] = [];
  private nextId = 1;
  private reader: AsyncReader | null = null;
  broken: string | null = null;
  /** The host's limit on a CALL body (EXEC's maxCallBytes): a larger request fails here, not the run. */
  maxCallBytes: number | null = null;

  constructor(
    private readonly platform: Platform,
    private readonly fd: number,
  ) {}

  send(kind: Kind, body: Body): void {
    writeAll(this.platform.libc, this.fd, encode(kind, body));
  }

  /** Block until the host sends a frame (with the descriptors that came with it); null at the end. */
  nextCommandSync(): Command | null {
    for (;;) {
      const frame = this.parser.next();
      if (frame !== null) {
        const fds = frame[0] === Kind.EXEC ? this.fds : [];
        if (frame[0] === Kind.EXEC) this.fds = [];
        return [frame[0], frame[1], fds];
      }
      const size = Math.min(Math.max(this.parser.wanted(), CHUNK), MAX_CHUNK);
      const { data, fds } = receive(this.platform.libc, this.fd, size);
      this.fds.push(...fds);
      if (!data.length) {
        this.parser.checkEnd();
        return null;
      }
      this.parser.feed(data);
    }
  }

  /** Send request `op` as a CALL frame; resolves with the host's REPLY body. */
  request(op: string, body: Body): Promise<Body> {
    if (this.broken !== null) return Promise.reject(new HostUnavailable(this.broken));
    const id = this.nextId++;
    const frame = encode(Kind.CALL, { ...body, op, id });
    const size = frame.length - HEADER_SIZE;
    if (this.maxCallBytes !== null && size > this.maxCallBytes) {
      // The host would end the run on such a frame: the code gets an error it can handle.
      const message = `the request is ${size} bytes, over the server's max_call_bytes (${this.maxCallBytes})`;
      return Promise.resolve({ id, ok: false, error: { kind: "invalid", message } });
    }
    const reply = new Promise<Body>((resolve, reject) => this.pending.set(id, { resolve, reject }));
    try {
      writeAll(this.platform.libc, this.fd, frame);
    } catch (error) {
      this.pending.delete(id);
      return Promise.reject(new HostUnavailable(`the channel to the host is closed: ${error}`));
    }
    this.reader ??= this.platform.openReader(
      this.fd,
      (chunk) => this.received(chunk),
      () => this.broken === null && (this.pending.size > 0 || this.parser.buffered > 0),
    );
    this.reader.poke();
    return reply;
  }

  private received(chunk: Uint8Array | null): void {
    try {
      if (chunk === null) {
        this.parser.checkEnd();
        this.end("the host closed the channel");
        return;
      }
      this.parser.feed(chunk);
      let frame;
      while ((frame = this.parser.next()) !== null) {
        const [kind, body] = frame;
        if (kind === Kind.REPLY) {
          const waiting = typeof body.id === "number" ? this.pending.get(body.id) : undefined;
          if (waiting !== undefined) {
            this.pending.delete(body.id as number);
            waiting.resolve(body);
          }
        } else if (kind === Kind.ERROR) {
          this.end(`the host reported a protocol error: ${String(body.message)}`);
          return;
        } else {
          this.fail(`expected a REPLY frame during a run, got ${Kind[kind]}`);
          return;
        }
      }
    } catch (error) {
      this.fail(`the channel to the host broke: ${(error as Error).message}`);
    }
  }

  private fail(reason: string): void {
    try {
      this.send(Kind.ERROR, { message: reason });
    } catch {
      // the host is gone already
    }
    this.end(reason);
  }

  private end(reason: string): void {
    this.broken ??= reason;
    const waiting = [...this.pending.values()];
    this.pending.clear();
    for (const { reject } of waiting) reject(new HostUnavailable(reason));
  }
}

/** Why `body` is not a valid EXEC frame, or null. */
function invalidExec(body: Body, fds: number[]): string | null {
  if (typeof body.code !== "string") return "an EXEC frame needs code";
  const servers = body.servers ?? [];
  if (!Array.isArray(servers) || !servers.every((alias) => typeof alias === "string" && /^[A-Za-z_]\w*$/.test(alias))) {
    return "EXEC servers must be a list of aliases";
  }
  const env = body.env ?? {};
  if (
    typeof env !== "object" ||
    env === null ||
    Array.isArray(env) ||
    !Object.entries(env).every(
      ([key, value]) => key && typeof value === "string" && !key.includes("=") && !(key + value).includes("\0"),
    )
  ) {
    return "EXEC env must map variable names to strings";
  }
  if (typeof body.run !== "number" || !Number.isInteger(body.run) || body.run < 0) {
    return "EXEC run must be a non-negative integer";
  }
  if (fds.length !== 2) return `an EXEC frame carries its stdout and stderr pipes, not ${fds.length} descriptors`;
  return null;
}

/** The error's stack (or text) without the runner's own frames below the user's. */
export function describeError(error: unknown): string {
  if (error instanceof Error && typeof error.stack === "string") {
    const lines = error.stack.split("\n").filter((line) => !(/^\s+at /.test(line) && line.includes(RUNTIME_DIR)));
    let text = lines.join("\n");
    if (!text.includes(error.message)) text = `${error.name}: ${error.message}\n${text}`;
    if (error.cause !== undefined) text += `\n[cause]: ${describeError(error.cause)}`;
    return text;
  }
  try {
    return `Uncaught ${typeof error === "string" ? JSON.stringify(error) : String(error)}`;
  } catch {
    return "Uncaught exception";
  }
}

/** Serve one run: READY, EXEC, the code; DONE is sent as the process exits. */
export async function main(platform: Platform, args: string[]): Promise<void> {
  const [language, channel] = args;
  if ((language !== "typescript" && language !== "javascript") || !channel || !/^\d+$/.test(channel)) {
    console.error("usage: <entry> typescript|javascript CHANNEL_FD");
    platform.exit(EXIT_USAGE);
  }
  const connection = new Connection(platform, Number(channel));
  await warmUp(platform);
  connection.send(Kind.READY, { runtime: platform.runtime, version: platform.version, language });
  let command: Command | null;
  try {
    command = connection.nextCommandSync();
  } catch (error) {
    console.error(`mcp-sandbox runner: ${error instanceof FrameError ? error.message : String(error)}`);
    platform.exit(EXIT_PROTOCOL);
  }
  if (command === null) platform.exit(EXIT_PROTOCOL); // the host hung up before any run
  const [kind, body, fds] = command;
  const problem = kind === Kind.EXEC ? invalidExec(body, fds) : `expected an EXEC frame, got ${Kind[kind]}`;
  if (problem !== null) {
    for (const fd of fds) platform.libc.close(fd);
    connection.send(Kind.ERROR, { message: problem });
    platform.exit(EXIT_PROTOCOL);
  }
  const run = body.run as number;
  dup2(platform.libc, fds[0]!, 1);
  dup2(platform.libc, fds[1]!, 2);
  for (const fd of fds) platform.libc.close(fd);
  platform.setEnv(body.env as Record<string, string>);
  if (typeof body.maxCallBytes === "number") connection.maxCallBytes = body.maxCallBytes;

  let reported = false;
  const finish = (code: number, exception: string | null): void => {
    if (reported) return;
    reported = true;
    try {
      connection.send(Kind.DONE, { run, exitCode: code & 0xff, exception });
    } catch {
      // the host is gone: the process's exit code still tells
    }
  };
  platform.onExit((code) => finish(code, null));
  platform.onUncaught((error) => {
    console.error(describeError(error));
    finish(1, error instanceof Error ? error.name : typeof error);
    platform.exit(1);
  });
  // The server's tool_results setting: "raw" gives tool calls the whole result (the earlier bridge's shape).
  const wholeResults = (body.env as Record<string, string>).MCP_SANDBOX_TOOL_RESULTS === "raw";
  (globalThis as Record<string, unknown>).mcp = createApi(connection, body.servers as string[], { wholeResults });

  const path = `${CODE_DIR}/main.${language === "typescript" ? "ts" : "js"}`;
  try {
    platform.mkdir(CODE_DIR);
    platform.writeFile(path, body.code as string);
    linkWorkspacePackages(platform);
  } catch (error) {
    console.error(`mcp-sandbox runner: cannot write the code to ${path}: ${String(error)}`);
    finish(EXIT_PROTOCOL, null);
    platform.exit(EXIT_PROTOCOL);
  }
  try {
    await import(path);
  } catch (error) {
    console.error(describeError(error));
    finish(1, error instanceof Error ? error.name : typeof error);
    platform.exit(1);
  }
  // Done with the top level: the process ends when the code's event loop is empty.
}

/**
 * Do once before READY what a run does first, so that the run does not pay for the first use:
 * parse an EXEC frame, set the environment, load a TypeScript module (warm.ts: the module loader
 * and the transpiler). Nothing of the code's is involved, and nothing stays that it could see
 * but CODE_DIR, which the run makes anyway.
 */
async function warmUp(platform: Platform): Promise<void> {
  try {
    const parser = new FrameParser(DEFAULT_MAX_FRAME);
    parser.feed(encode(Kind.EXEC, { run: 0, code: "", servers: [], env: {} }));
    const frame = parser.next();
    if (frame !== null) invalidExec(frame[1], [-1, -1]);
    platform.setEnv({});
    platform.mkdir(CODE_DIR);
    const warm = (await import(`${RUNTIME_DIR}warm.ts`)) as { measure: (shape: { name: string }) => Promise<unknown> };
    await warm.measure({ name: "warm" });
  } catch {
    // only slower: the run does it again
  }
}

/** Link CODE_DIR/node_modules to the workspace's packages (once per process: a session's later runs find it). */
function linkWorkspacePackages(platform: Platform): void {
  try {
    platform.symlink(WORKSPACE_PACKAGES, `${CODE_DIR}/node_modules`);
  } catch {
    // already there (a session's earlier run)
  }
}
