/**
 * The relay to the host's egress proxy (bun and deno, through node:net).
 *
 * A sandbox granted network has no interface but loopback. When MCP_SANDBOX_EGRESS_SOCKET names
 * the proxy's Unix socket (bound in by the host), this listens on MCP_SANDBOX_EGRESS_RELAY (where
 * HTTP_PROXY and friends point) and copies every connection to that socket and back. The relay
 * decides nothing: the proxy on the host checks every request. It never keeps a run alive.
 */

import { connect, createServer } from "node:net";

export function startRelay(env: Record<string, string | undefined>): void {
  const path = env.MCP_SANDBOX_EGRESS_SOCKET;
  const address = env.MCP_SANDBOX_EGRESS_RELAY;
  if (!path || !address) return;
  const at = address.lastIndexOf(":");
  const server = createServer((client) => {
    const upstream = connect({ path });
    client.pipe(upstream);
    upstream.pipe(client);
    client.on("error", () => upstream.destroy());
    upstream.on("error", () => client.destroy());
  });
  server.on("error", (error: Error) => console.error(`mcp-sandbox runner: the network relay did not start: ${error.message}`));
  server.listen(Number(address.slice(at + 1)), address.slice(0, at));
  server.unref();
}
