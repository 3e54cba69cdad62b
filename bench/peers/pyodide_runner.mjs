// A Pyodide-based runner for bench/alternatives.py, the way such MCP servers run code: one
// Pyodide instance in a node process, each run's code given to it, its stdout captured.
//
//   node pyodide_runner.mjs --once CODE   load Pyodide, run CODE, print its output, exit
//   node pyodide_runner.mjs               load Pyodide once, then for each JSON line {"code": ...}
//                                         on stdin run it in that instance (its globals kept, as
//                                         a conversation's) and answer {"stdout": ...} or {"error": ...}
import { loadPyodide } from "pyodide";
import { createInterface } from "node:readline";

const pyodide = await loadPyodide();
let captured = "";
pyodide.setStdout({ batched: (line) => { captured += line + "\n"; } });

function run(code) {
  captured = "";
  pyodide.runPython(code);
  return captured;
}

if (process.argv[2] === "--once") {
  process.stdout.write(run(process.argv[3]));
} else {
  process.stdout.write(JSON.stringify({ ready: true }) + "\n");
  for await (const line of createInterface({ input: process.stdin })) {
    let answer;
    try {
      answer = { stdout: run(JSON.parse(line).code) };
    } catch (error) {
      answer = { error: String(error) };
    }
    process.stdout.write(JSON.stringify(answer) + "\n");
  }
}
