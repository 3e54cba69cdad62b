// A call the MCP TypeScript SDK's own client aborts, as a user of that SDK would write it.
//
// Used by test_ts_client_cancel.py, which copies this file next to a node_modules holding
// @modelcontextprotocol/sdk and runs it with the path of a JSON file:
//   {"server": {"command": ..., "args": [...], "env": {...}} or {"url": ..., "token": ...},
//    "call": {"name": ..., "arguments": {...}}, "next": {"name": ..., "arguments": {...}}}
// It connects (over stdio to the command, or over Streamable HTTP to the url), makes `call` with
// an AbortSignal and prints {"event": "calling"}; on the line "abort" on its stdin it aborts
// (the SDK sends notifications/cancelled) and prints {"event": "aborted", ...}; then it makes
// `next` and prints {"event": "next", ...}; on the line "close" it closes the client and exits.

import { readFileSync } from "node:fs";
import { createInterface } from "node:readline";
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";

const input = JSON.parse(readFileSync(process.argv[2], "utf8"));
const lines = createInterface({ input: process.stdin })[Symbol.asyncIterator]();
const say = (event) => process.stdout.write(JSON.stringify(event) + "\n");

async function expect(word) {
  const { value, done } = await lines.next();
  if (done || value.trim() !== word) throw new Error(`expected ${word} on stdin, got ${value}`);
}

const transport =
  input.server.url === undefined
    ? new StdioClientTransport({ ...input.server, stderr: "inherit" })
    : new StreamableHTTPClientTransport(new URL(input.server.url), {
        requestInit: { headers: { Authorization: `Bearer ${input.server.token}` } },
      });
const client = new Client({ name: "ts-cancel-test", version: "0.0.0" });
await client.connect(transport);

const controller = new AbortController();
const options = { signal: controller.signal, timeout: 600000 };
const pending = client.callTool(input.call, undefined, options).then(
  (result) => ({ ok: true, result }),
  (error) => ({ ok: false, error: { name: error?.name, message: String(error?.message ?? error) } }),
);
say({ event: "calling" });
await expect("abort");
controller.abort("the test gave up");
say({ event: "aborted", ...(await pending) });
const next = await client.callTool(input.next, undefined, { timeout: 60000 });
say({ event: "next", result: next });
await expect("close");
await client.close();
