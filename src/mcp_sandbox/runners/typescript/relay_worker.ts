/**
 * The relay's thread (started by relay.ts): listens on the loopback address in `workerData` and
 * pipes every connection to the egress proxy's Unix socket. Posts null once it listens, or the
 * reason it could not.
 */

import { connect, createServer } from "node:net";
import { parentPort, workerData } from "node:worker_threads";

const { path, address } = workerData as { path: string; address: string };
const at = address.lastIndexOf(":");
const server = createServer((client) => {
  const upstream = connect({ path });
  client.pipe(upstream);
  upstream.pipe(client);
  client.on("error", () => upstream.destroy());
  upstream.on("error", () => client.destroy());
});
server.once("error", (error: Error) => parentPort?.postMessage(error.message));
server.listen(Number(address.slice(at + 1)), address.slice(0, at), () => parentPort?.postMessage(null));
