// Bundles the playground (src/) into the Python package, where the server serves it at `/`:
// src/mcp_sandbox/server/static/{index.html, playground.js, playground.css}. `make web` runs it.
import { build } from "esbuild";
import { copyFile, mkdir, rm } from "node:fs/promises";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

const here = dirname(fileURLToPath(import.meta.url));
const out = join(here, "..", "src", "mcp_sandbox", "server", "static");

await rm(out, { recursive: true, force: true });
await mkdir(out, { recursive: true });
const result = await build({
  entryPoints: [join(here, "src", "main.js")],
  bundle: true,
  minify: true,
  format: "esm",
  target: ["es2022"],
  outfile: join(out, "playground.js"),
  legalComments: "linked",
  metafile: true,
  logLevel: "warning",
});
await copyFile(join(here, "src", "index.html"), join(out, "index.html"));
await copyFile(join(here, "src", "playground.css"), join(out, "playground.css"));
const bytes = Object.values(result.metafile.outputs).reduce((sum, o) => sum + o.bytes, 0);
console.log(`playground: ${out} (${Math.round(bytes / 1024)} KiB of JavaScript)`);
