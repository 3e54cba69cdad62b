// Bundles the playground (src/) into the Python package, where the server serves it at `/`:
// src/mcp_sandbox/server/static/{index.html, playground.js, playground.css}, and the run's MCP Apps
// view into static/run-view.html: one self-contained page (script and style inline, allowed by
// their hashes in its Content-Security-Policy), which the server hands to MCP hosts as the
// resource ui://mcp-sandbox/run. `make web` runs it.
import { build } from "esbuild";
import { createHash } from "node:crypto";
import { copyFile, mkdir, readFile, rm, writeFile } from "node:fs/promises";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

const here = dirname(fileURLToPath(import.meta.url));
const out = join(here, "..", "src", "mcp_sandbox", "server", "static");

const common = { bundle: true, minify: true, format: "esm", target: ["es2022"], metafile: true, logLevel: "warning" };

await rm(out, { recursive: true, force: true });
await mkdir(out, { recursive: true });
const result = await build({
  ...common,
  entryPoints: [join(here, "src", "main.js")],
  outfile: join(out, "playground.js"),
  legalComments: "linked",
});
await copyFile(join(here, "src", "index.html"), join(out, "index.html"));
await copyFile(join(here, "src", "playground.css"), join(out, "playground.css"));
const bytes = Object.values(result.metafile.outputs).reduce((sum, o) => sum + o.bytes, 0);
console.log(`playground: ${out} (${Math.round(bytes / 1024)} KiB of JavaScript)`);

// The view: nothing may be fetched, so everything is in the page.
const view = await build({
  ...common,
  entryPoints: [join(here, "src", "run-view.js")],
  write: false,
  outfile: "run-view.js",
  legalComments: "none",
});
const script = view.outputFiles[0].text.trimEnd();
if (script.includes("</script")) throw new Error("the view's script would end its <script> element early");
const style = (await readFile(join(here, "src", "run-view.css"), "utf8")).trimEnd();
const hash = (text) => `'sha256-${createHash("sha256").update(text).digest("base64")}'`;
const policy = [
  "default-src 'none'",
  `script-src ${hash(script)}`,
  `style-src ${hash(style)}`,
  "img-src data:",
  "base-uri 'none'",
  "form-action 'none'",
].join("; ");
const template = await readFile(join(here, "src", "run-view.html"), "utf8");
const page = template.replace("__CSP__", policy).replace("__STYLE__", () => style).replace("__SCRIPT__", () => script);
await writeFile(join(out, "run-view.html"), page);
console.log(`run view: ${join(out, "run-view.html")} (${Math.round(page.length / 1024)} KiB)`);
