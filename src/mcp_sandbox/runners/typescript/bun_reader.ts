/**
 * bun's channel reader: a worker blocked in read(2) on the channel, posting each chunk to the
 * runner (null at the end). Replies carry no descriptors, so a plain read is right here: any
 * descriptor sent along is closed by the kernel.
 */

import { dlopen, FFIType, ptr, read } from "bun:ffi";

declare const self: Worker;

const EINTR = 4;
const CHUNK = 1 << 16;
const lib = dlopen("libc.so.6", {
  read: { args: [FFIType.i32, FFIType.ptr, FFIType.u64], returns: FFIType.i64 },
  __errno_location: { args: [], returns: FFIType.ptr },
});

self.onmessage = (event: MessageEvent<number>) => {
  const fd = event.data;
  const buffer = new Uint8Array(CHUNK);
  for (;;) {
    const count = Number(lib.symbols.read(fd, ptr(buffer), CHUNK));
    if (count < 0 && read.i32(lib.symbols.__errno_location()!, 0) === EINTR) continue;
    if (count <= 0) {
      self.postMessage(null);
      return;
    }
    self.postMessage(buffer.slice(0, count));
  }
};
