/**
 * Entry on bun: `bun run /opt/mcp-sandbox/typescript/bun.ts LANGUAGE CHANNEL_FD`.
 *
 * libc through bun:ffi. Bun's FFI calls block the thread that makes them, so replies are read by
 * a worker (bun_reader.ts) blocked in read(2); it is referenced only while a reply is awaited, so
 * it never keeps a finished run alive.
 *
 * The code's file, its directory and the workspace link are made through libc too, not node:fs:
 * loading node:fs costs bun 1.4 about 2 ms of CPU, a fifth of what a whole pre-started sandbox
 * costs it, paid before READY by every sandbox (the code still loads node:fs when it imports it).
 */

import { dlopen, FFIType, ptr, read } from "bun:ffi";
import { EEXIST, type Libc, SyscallError, writeAll } from "./libc.ts";
import type { AsyncReader, Platform } from "./platform.ts";
import { startRelay } from "./relay.ts";
import { main } from "./runner.ts";

const { i32, i64, ptr: pointer, u32, u64 } = FFIType;
const lib = dlopen("libc.so.6", {
  recvmsg: { args: [i32, pointer, i32], returns: i64 },
  read: { args: [i32, pointer, u64], returns: i64 },
  write: { args: [i32, pointer, u64], returns: i64 },
  dup: { args: [i32], returns: i32 },
  dup2: { args: [i32, i32], returns: i32 },
  close: { args: [i32], returns: i32 },
  __errno_location: { args: [], returns: pointer },
  creat: { args: [pointer, u32], returns: i32 },
  mkdir: { args: [pointer, u32], returns: i32 },
  symlink: { args: [pointer, pointer], returns: i32 },
});
const calls = lib.symbols;
const encoder = new TextEncoder();
const cString = (text: string): Uint8Array => encoder.encode(`${text}\0`);

const libc: Libc = {
  address: (buffer) => BigInt(ptr(buffer)),
  recvmsg: (fd, header, flags) => Number(calls.recvmsg(fd, header, flags)),
  read: (fd, buffer, length) => Number(calls.read(fd, buffer, length)),
  write: (fd, buffer, length) => Number(calls.write(fd, buffer, length)),
  dup: (fd) => calls.dup(fd),
  dup2: (fd, target) => calls.dup2(fd, target),
  close: (fd) => calls.close(fd),
  errno: () => read.i32(calls.__errno_location()!, 0),
};

function writeFile(path: string, text: string): void {
  const fd = calls.creat(cString(path), 0o666);
  if (fd < 0) throw new SyscallError(`creat ${path}`, libc.errno());
  try {
    writeAll(libc, fd, encoder.encode(text));
  } finally {
    calls.close(fd);
  }
}

/** mkdir -p: every missing directory on the way, each made as mkdir(2) does (0777 less the umask). */
function mkdirs(path: string): void {
  for (let end = path.indexOf("/", 1); ; end = path.indexOf("/", end + 1)) {
    const directory = end < 0 ? path : path.slice(0, end);
    if (calls.mkdir(cString(directory), 0o777) < 0) {
      const errno = libc.errno();
      if (errno !== EEXIST) throw new SyscallError(`mkdir ${directory}`, errno);
    }
    if (end < 0) return;
  }
}

function symlink(target: string, path: string): void {
  if (calls.symlink(cString(target), cString(path)) < 0) throw new SyscallError(`symlink ${path}`, libc.errno());
}

class WorkerReader implements AsyncReader {
  private readonly worker: Worker;

  constructor(
    fd: number,
    onData: (chunk: Uint8Array | null) => void,
    private readonly wanted: () => boolean,
  ) {
    this.worker = new Worker(new URL("./bun_reader.ts", import.meta.url).href);
    this.worker.onmessage = (event: MessageEvent<Uint8Array | null>) => {
      onData(event.data);
      this.poke();
    };
    this.worker.postMessage(fd);
  }

  poke(): void {
    if (this.wanted()) this.worker.ref();
    else this.worker.unref();
  }
}

const platform: Platform = {
  runtime: "bun",
  version: Bun.version,
  libc,
  openReader: (fd, onData, wanted) => new WorkerReader(fd, onData, wanted),
  setEnv: (env) => void Object.assign(process.env, env),
  writeFile,
  mkdir: mkdirs,
  symlink,
  onExit: (handler) => void process.on("exit", (code) => handler(code ?? 0)),
  onUncaught: (handler) => {
    process.on("uncaughtException", handler);
    process.on("unhandledRejection", handler);
  },
  exit: (code) => process.exit(code),
};

await startRelay(process.env);
await main(platform, process.argv.slice(2));
