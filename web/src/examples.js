// Canned examples per language. `needs` names what the server must offer for one to be listed;
// `conversation` marks one about files or variables kept: choosing it starts a conversation.

const python = [
  {
    id: "hello",
    title: "Hello world",
    code: `import platform

print("Hello, world!")
print(f"Python {platform.python_version()}")
`,
  },
  {
    id: "pandas",
    title: "Data analysis with pandas",
    code: `import pandas as pd

sales = pd.DataFrame({
    "region": ["north", "south", "east", "west"] * 2,
    "quarter": ["Q1"] * 4 + ["Q2"] * 4,
    "revenue": [120, 95, 143, 88, 131, 102, 150, 97],
})
by_region = sales.groupby("region")["revenue"].agg(["sum", "mean"]).sort_values("sum", ascending=False)

# Printed as Markdown: the playground renders it.
print("## Revenue by region\\n")
print("| region | total | mean |")
print("|---|---:|---:|")
for region, row in by_region.iterrows():
    print(f"| {region} | {row['sum']:.0f} | {row['mean']:.1f} |")

growth = sales.pivot(index="region", columns="quarter", values="revenue")
growth["growth"] = (growth["Q2"] / growth["Q1"] - 1) * 100
print(f"\\n**Best growth:** {growth['growth'].idxmax()} ({growth['growth'].max():.1f} %)")
`,
  },
  {
    id: "plot",
    title: "Plot with matplotlib",
    code: `import matplotlib.pyplot as plt
import numpy as np

x = np.linspace(0, 4 * np.pi, 400)
fig, ax = plt.subplots(figsize=(6, 3.5))
ax.plot(x, np.sin(x), label="sin x")
ax.plot(x, np.cos(x), label="cos x")
ax.set_title("Two waves")
ax.legend()
ax.grid(alpha=0.3)
plt.show()  # the figure comes back as an image
print("plotted", len(x), "points")
`,
  },
  {
    id: "files",
    title: "Files: write, read back, download",
    conversation: true,
    code: `import csv
import os
from pathlib import Path

# /workspace belongs to the conversation: files stay between runs and can be downloaded.
path = Path("/workspace/squares.csv")
with path.open("w", newline="") as f:
    writer = csv.writer(f)
    writer.writerow(["n", "square"])
    writer.writerows((n, n * n) for n in range(1, 11))

rows = list(csv.DictReader(path.open()))
print(f"wrote {path} ({path.stat().st_size} bytes) and read back {len(rows)} rows")
print("last row:", rows[-1])
if "FILE_BASE_URL" in os.environ:
    print("download:", os.environ["FILE_BASE_URL"] + "/squares.csv")
`,
  },
  {
    id: "uploads",
    title: "Read uploaded CSV files",
    conversation: true,
    code: `from pathlib import Path

import pandas as pd

# Upload CSV files (pick or drop them under the result), then run this.
found = sorted(p for p in Path("/workspace").glob("*.csv"))
if not found:
    print("no CSV file in /workspace yet: upload one first")
for path in found:
    table = pd.read_csv(path)
    print(f"{path.name}: {len(table)} rows, columns {list(table.columns)}")
    print(table.describe().to_string())
`,
  },
  {
    id: "variables",
    title: "Conversation: variables kept",
    conversation: true,
    code: `# In a conversation the interpreter stays: variables set by one run are there in the next.
# Run this twice.
try:
    runs += 1
except NameError:
    runs = 1
print(f"run {runs} in this conversation")
`,
  },
  {
    id: "environment",
    title: "Environment variables",
    code: `import os

# Add GREETING under "Environment variables" and run again.
print("GREETING =", os.environ.get("GREETING", "(not set)"))
`,
  },
  {
    id: "code-mode",
    title: "Code mode: the configured MCP servers",
    needs: "servers",
    code: `from mcp import runtime

# Searching and reading tool docs works for every configured server; calling a tool needs
# the server named in the call's \`servers\`.
for server in runtime.discovered_servers():
    print(server)
print()
for hit in runtime.search_tools("time", limit=5):
    print(hit)
`,
  },
];

const typescript = [
  {
    id: "hello",
    title: "Hello world",
    code: `const who: string = "world";
console.log(\`Hello, \${who}!\`);
`,
  },
  {
    id: "fibonacci",
    title: "Fibonacci",
    code: `function* fibonacci(): Generator<bigint> {
  let [a, b] = [0n, 1n];
  for (;;) {
    yield a;
    [a, b] = [b, a + b];
  }
}

const first: bigint[] = [];
for (const n of fibonacci()) {
  if (first.length === 30) break;
  first.push(n);
}
console.log(first.join(", "));
`,
  },
  {
    id: "files",
    title: "Files: write, read back, download",
    conversation: true,
    code: `import { readFileSync, statSync, writeFileSync } from "node:fs";

const path = "/workspace/notes.json";
writeFileSync(path, JSON.stringify({ items: [1, 2, 3], note: "written by TypeScript" }, null, 2));
const back: { items: number[] } = JSON.parse(readFileSync(path, "utf8"));
console.log(\`wrote \${path} (\${statSync(path).size} bytes); items: \${back.items.join(", ")}\`);
`,
  },
];

const javascript = [
  {
    id: "hello",
    title: "Hello world",
    code: `console.log("Hello, world!");
`,
  },
  {
    id: "fibonacci",
    title: "Fibonacci",
    code: `const memo = new Map([[0, 0n], [1, 1n]]);
const fib = (n) => {
  if (!memo.has(n)) memo.set(n, fib(n - 1) + fib(n - 2));
  return memo.get(n);
};
console.log("fib(100) =", fib(100).toString());
`,
  },
];

const byLanguage = { python, typescript, javascript };

/** The examples for `language` the server can run (`offers`: a set like {"servers"}). */
export function examplesFor(language, offers) {
  return (byLanguage[language] ?? []).filter((example) => !example.needs || offers.has(example.needs));
}
