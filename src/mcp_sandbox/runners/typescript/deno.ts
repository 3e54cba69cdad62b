/**
 * Entry on deno: `deno run [permissions] /opt/mcp-sandbox/typescript/deno.ts LANGUAGE CHANNEL_FD`.
 *
 * libc through Deno.dlopen. Replies are read by a `nonblocking` FFI read (run on a thread of
 * Deno's, resolved as a promise), issued only while a reply is awaited: a pending read keeps the
 * process alive, so none is left pending when the code is done.
 */

import type { Libc } from "./libc.ts";
import type { AsyncReader, Platform } from "./platform.ts";
import { main } from "./runner.ts";
import { startRelay } from "./relay.ts";

const CHUNK = 1 << 16;
const lib = Deno.dlopen("libc.so.6", {
  recvmsg: { parameters: ["i32", "buffer", "i32"], result: "isize" },
  read: { parameters: ["i32", "buffer", "usize"], result: "isize" },
  readLater: { name: "read", parameters: ["i32", "buffer", "usize"], result: "isize", nonblocking: true },
  write: { parameters: ["i32", "buffer", "usize"], result: "isize" },
  dup: { parameters: ["i32"], result: "i32" },
  dup2: { parameters: ["i32", "i32"], result: "i32" },
  close: { parameters: ["i32"], result: "i32" },
  __errno_location: { parameters: [], result: "pointer" },
});
const calls = lib.symbols;

const libc: Libc = {
  address: (buffer) => BigInt(Deno.UnsafePointer.value(Deno.UnsafePointer.of(buffer as Uint8Array<ArrayBuffer>))),
  recvmsg: (fd, header, flags) => Number(calls.recvmsg(fd, header as Uint8Array<ArrayBuffer>, flags)),
  read: (fd, buffer, length) => Number(calls.read(fd, buffer as Uint8Array<ArrayBuffer>, BigInt(length))),
  write: (fd, buffer, length) => Number(calls.write(fd, buffer as Uint8Array<ArrayBuffer>, BigInt(length))),
  dup: (fd) => calls.dup(fd),
  dup2: (fd, target) => calls.dup2(fd, target),
  close: (fd) => calls.close(fd),
  errno: () => new Deno.UnsafePointerView(calls.__errno_location()!).getInt32(),
};

class LaterReader implements AsyncReader {
  private reading = false;
  private readonly buffer = new Uint8Array(CHUNK);

  constructor(
    private readonly fd: number,
    private readonly onData: (chunk: Uint8Array | null) => void,
    private readonly wanted: () => boolean,
  ) {}

  poke(): void {
    if (!this.reading && this.wanted()) void this.pump();
  }

  private async pump(): Promise<void> {
    this.reading = true;
    try {
      while (this.wanted()) {
        // errno belongs to the thread that ran the call: a failed read ends the channel.
        const count = Number(await calls.readLater(this.fd, this.buffer, BigInt(CHUNK)));
        this.onData(count > 0 ? this.buffer.slice(0, count) : null);
        if (count <= 0) return;
      }
    } finally {
      this.reading = false;
    }
  }
}

const platform: Platform = {
  runtime: "deno",
  version: Deno.version.deno,
  libc,
  openReader: (fd, onData, wanted) => new LaterReader(fd, onData, wanted),
  setEnv: (env) => {
    for (const [key, value] of Object.entries(env)) Deno.env.set(key, value);
  },
  writeFile: (path, text) => Deno.writeTextFileSync(path, text),
  mkdir: (path) => Deno.mkdirSync(path, { recursive: true }),
  symlink: (target, path) => Deno.symlinkSync(target, path),
  onExit: (handler) => {
    // Dispatched at a natural end and by Deno.exit. Node's process.exit and process.exitCode
    // set Deno.exitCode themselves, so nothing here touches `process`: Deno builds its Node.js
    // compatibility layer on the first access (~13 ms, and 2 MiB), which a run that never uses
    // it should not pay for.
    globalThis.addEventListener("unload", () => handler(Deno.exitCode));
  },
  onUncaught: (handler) => {
    globalThis.addEventListener("error", (event) => {
      event.preventDefault();
      handler(event.error);
    });
    globalThis.addEventListener("unhandledrejection", (event) => {
      event.preventDefault();
      handler(event.reason);
    });
  },
  exit: (code) => {
    Deno.exitCode = code;
    return Deno.exit(code);
  },
};

await startRelay(Deno.env.toObject());
await main(platform, Deno.args);
