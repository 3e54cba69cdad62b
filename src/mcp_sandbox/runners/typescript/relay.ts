/**
 * The relay to the host's egress proxy (bun and deno, through node:net in a worker thread).
 *
 * A sandbox granted network has no interface but loopback. When MCP_SANDBOX_EGRESS_SOCKET names
 * the proxy's Unix socket (bound in by the host), relay_worker.ts listens on
 * MCP_SANDBOX_EGRESS_RELAY (where HTTP_PROXY and friends point) and copies every connection to
 * that socket and back. It runs in a thread of its own so that code blocking the main thread
 * still gets its connections relayed: `Bun.spawnSync(["bun", "add", ...])` or `execSync("npm
 * install")` wait for a child whose every request goes through the relay (on the main thread's
 * event loop, the child would wait forever). The relay decides nothing: the proxy on the host
 * checks every request. It never keeps a run alive (the worker is unreferenced).
 */

/**
 * Start the relay if the environment names one; resolves once it listens (or could not).
 *
 * node:worker_threads is imported only then: loading it costs bun about 4 ms of CPU, which every
 * sandbox without network would pay before READY.
 */
export async function startRelay(env: Record<string, string | undefined>): Promise<void> {
  const path = env.MCP_SANDBOX_EGRESS_SOCKET;
  const address = env.MCP_SANDBOX_EGRESS_RELAY;
  if (!path || !address) return;
  const { Worker } = await import("node:worker_threads");
  const worker = new Worker(new URL("./relay_worker.ts", import.meta.url), { workerData: { path, address } });
  worker.unref();
  return new Promise((resolve) => {
    worker.once("message", (failure: string | null) => {
      if (failure !== null) console.error(`mcp-sandbox runner: the network relay did not start: ${failure}`);
      resolve();
    });
    worker.once("error", (error: Error) => {
      console.error(`mcp-sandbox runner: the network relay stopped: ${error.message}`);
      resolve();
    });
  });
}
