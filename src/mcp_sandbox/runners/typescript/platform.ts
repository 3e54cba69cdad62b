/** What the runner needs from the JavaScript runtime it runs on (bun.ts and deno.ts provide it). */

import type { Libc } from "./libc.ts";

/** Reads the channel asynchronously, and only while `wanted()` says so (see `Platform.openReader`). */
export interface AsyncReader {
  /** `wanted()` may have changed: start reading (or let the reader go idle). */
  poke(): void;
}

export interface Platform {
  readonly runtime: "bun" | "deno";
  readonly version: string;
  readonly libc: Libc;
  /**
   * Deliver the channel's bytes to `onData` (null at its end), reading only while `wanted()`:
   * a read in progress keeps the process alive, so an idle reader lets a finished run end.
   */
  openReader(fd: number, onData: (chunk: Uint8Array | null) => void, wanted: () => boolean): AsyncReader;
  setEnv(env: Record<string, string>): void;
  writeFile(path: string, text: string): void;
  mkdir(path: string): void;
  /** Make `path` a symbolic link to `target` (which need not exist); throws if `path` exists. */
  symlink(target: string, path: string): void;
  /** Call `handler` with the exit code whenever the process exits (process.exit, natural end). */
  onExit(handler: (code: number) => void): void;
  /** Call `handler` for an uncaught exception or an unhandled rejection. */
  onUncaught(handler: (error: unknown) => void): void;
  exit(code: number): never;
}
