// A long run through the MCP TypeScript SDK's own client, as a user of that SDK would write it.
//
// Used by test_ts_client_long_run.py, which copies this file next to a node_modules holding
// @modelcontextprotocol/sdk and runs it with one JSON argument:
//   {"command": ..., "args": [...], "env": {...}, "code": ..., "timeout": seconds}
// It starts our server over stdio, then makes two run_python calls at the same time, both with
// the SDK's default request timeout (no `timeout` option):
//   - "progress": with `onprogress` and `resetTimeoutOnProgress: true`;
//   - "control": the same call without them.
// It prints one JSON object: the SDK's default timeout, and for each call its result or error,
// how long it took, and the progress messages it received.

import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";
import { DEFAULT_REQUEST_TIMEOUT_MSEC } from "@modelcontextprotocol/sdk/shared/protocol.js";

const input = JSON.parse(process.argv[2]);

const transport = new StdioClientTransport({
  command: input.command,
  args: input.args,
  env: input.env,
  stderr: "inherit",
});
const client = new Client({ name: "ts-long-run-test", version: "0.0.0" });
await client.connect(transport);

async function call(options) {
  const progress = [];
  const started = performance.now();
  const request = { name: "run_python", arguments: { code: input.code, timeout: input.timeout } };
  const withProgress =
    options === undefined
      ? undefined
      : { ...options, onprogress: (p) => progress.push({ progress: p.progress, message: p.message ?? null }) };
  try {
    const result = await client.callTool(request, undefined, withProgress);
    return { ok: true, result, progress, elapsedMs: performance.now() - started };
  } catch (error) {
    return {
      ok: false,
      error: { name: error?.name, code: error?.code, message: String(error?.message ?? error) },
      progress,
      elapsedMs: performance.now() - started,
    };
  }
}

const [progress, control] = await Promise.all([
  call({ resetTimeoutOnProgress: true }),
  call(undefined),
]);
await client.close();

process.stdout.write(
  JSON.stringify({ defaultTimeoutMs: DEFAULT_REQUEST_TIMEOUT_MSEC, progress, control }) + "\n",
);
