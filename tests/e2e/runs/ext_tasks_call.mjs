// One run_python call through the MCP Tasks extension's own client (@modelcontextprotocol/ext-tasks
// over @modelcontextprotocol/client, as the Inspector installs them in conformance/node_modules).
//
// Used by test_tasks.py, which copies this file next to a node_modules link and runs it with one
// JSON argument: {"url": ..., "token": ..., "code": ...}. It connects in the 2025-11-25 era, calls
// run_python through a task session preferring a task (the tool's taskSupport is "optional") and
// prints one JSON object: how the call ran (`kind`: "task" or "immediate"), the task's id when it
// was one, and the settled outcome.

import { Client, StreamableHTTPClientTransport } from "@modelcontextprotocol/client";
import { createTaskSessionFromClient } from "@modelcontextprotocol/ext-tasks/client";

const input = JSON.parse(process.argv[2]);
const headers = { Authorization: `Bearer ${input.token}` };
const client = new Client({ name: "ext-tasks-test", version: "0.0.0" }, { protocolEra: "legacy" });
await client.connect(new StreamableHTTPClientTransport(new URL(input.url), { requestInit: { headers } }));
const session = createTaskSessionFromClient(client, { endpointId: "mcp-sandbox" });
try {
  const execution = await session.callTool(
    "run_python",
    { code: input.code },
    { task: { preference: "prefer" } },
  );
  const { outcome } = await execution.settle();
  const taskId = execution.handle?.taskId ?? null;
  console.log(JSON.stringify({ kind: execution.kind, taskId, outcome }));
} finally {
  await session.close();
  await client.close();
}
