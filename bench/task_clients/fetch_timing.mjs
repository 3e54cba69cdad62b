// Times every tasks/get a Node MCP client sends, where it sends it: loaded with `node --import`
// before the client (bench/long_tasks.py runs the Inspector CLI so), it wraps the global fetch.
// A request whose JSON-RPC method is tasks/get is timed from the call to the end of its answer's
// body (plain JSON or an event stream), and the status the answer carries is kept. At exit it
// writes {"polls": [ms, ...], "seen": [status, ...], "taskIds": [...]} to $LONG_TASKS_TIMINGS.

import { writeFileSync } from "node:fs";

const polls = [];
const seen = [];
const taskIds = new Set();
const original = globalThis.fetch;

function methodOf(init) {
  if (typeof init?.body !== "string") return null;
  try {
    return JSON.parse(init.body).method ?? null;
  } catch {
    return null;
  }
}

// The JSON-RPC messages of an answer: the body itself, or the data lines of an event stream.
function messages(text) {
  const trimmed = text.trim();
  if (trimmed.startsWith("{")) return [JSON.parse(trimmed)];
  return trimmed
    .split("\n")
    .filter((line) => line.startsWith("data:"))
    .map((line) => line.slice(5).trim())
    .filter((data) => data.startsWith("{"))
    .map((data) => JSON.parse(data));
}

globalThis.fetch = async (input, init) => {
  if (methodOf(init) !== "tasks/get") return original(input, init);
  const began = performance.now();
  const response = await original(input, init);
  const copy = response.clone();
  copy.text().then(
    (text) => {
      polls.push(performance.now() - began);
      for (const message of messages(text)) {
        const result = message.result;
        if (result?.status) seen.push(result.status);
        if (result?.taskId) taskIds.add(result.taskId);
      }
    },
    () => {},
  );
  return response;
};

process.on("exit", () => {
  if (process.env.LONG_TASKS_TIMINGS) {
    writeFileSync(process.env.LONG_TASKS_TIMINGS, JSON.stringify({ polls, seen, taskIds: [...taskIds] }));
  }
});
