/**
 * The few libc calls the runner needs that no JavaScript runtime offers: recvmsg with SCM_RIGHTS
 * (the host passes each run's stdout/stderr pipes on the channel socket), dup2 (to make those
 * pipes the process's fds 1 and 2) and raw blocking write/read on the channel.
 *
 * Each runtime's entry (bun.ts, deno.ts) binds libc through its own FFI and hands a `Libc` to the
 * runner; the struct layouts (x86-64 / aarch64 Linux, LP64) are built here, once.
 */

export interface Libc {
  /** The address of a buffer, for pointers stored inside structs. */
  address(buffer: Uint8Array): bigint;
  recvmsg(fd: number, msghdr: Uint8Array, flags: number): number;
  read(fd: number, buffer: Uint8Array, length: number): number;
  write(fd: number, buffer: Uint8Array, length: number): number;
  dup(fd: number): number;
  dup2(fd: number, target: number): number;
  close(fd: number): number;
  errno(): number;
}

export const EINTR = 4;
export const EEXIST = 17;
const SOL_SOCKET = 1;
const SCM_RIGHTS = 1;
const MSG_CMSG_CLOEXEC = 0x40000000;
const MSG_CTRUNC = 0x8;
const MAX_FDS = 8; // the host sends two; room for more so that extras are seen (and closed), not cut
const CMSG_HEADER = 16; // size_t cmsg_len; int cmsg_level; int cmsg_type
const CONTROL_SIZE = CMSG_HEADER + MAX_FDS * 4;

// The errors a user can cause or meet (a full /tmp, a read-only path), named as Node.js names them.
const ERRNO_NAMES: Record<number, string> = {
  2: "ENOENT",
  9: "EBADF",
  13: "EACCES",
  17: "EEXIST",
  20: "ENOTDIR",
  24: "EMFILE",
  28: "ENOSPC",
  30: "EROFS",
  32: "EPIPE",
  122: "EDQUOT",
};

export class SyscallError extends Error {
  override name = "SyscallError";
  constructor(
    readonly call: string,
    readonly errno: number,
  ) {
    const known = ERRNO_NAMES[errno];
    super(`${call} failed with ${known === undefined ? "" : `${known}, `}errno ${errno}`);
  }
}

/** What one recvmsg brought: bytes (empty at the end of the stream) and descriptors. */
export interface Received {
  data: Uint8Array;
  fds: number[];
}

/** Blocking recvmsg of up to `size` bytes from `fd`, with any descriptors (close-on-exec). */
export function receive(libc: Libc, fd: number, size: number): Received {
  const data = new Uint8Array(size);
  const control = new Uint8Array(CONTROL_SIZE);
  const iov = new Uint8Array(16); // struct iovec { void *base; size_t len; }
  const iovView = new DataView(iov.buffer);
  iovView.setBigUint64(0, libc.address(data), true);
  iovView.setBigUint64(8, BigInt(size), true);
  const header = new Uint8Array(56); // struct msghdr
  const view = new DataView(header.buffer);
  view.setBigUint64(16, libc.address(iov), true); // msg_iov
  view.setBigUint64(24, 1n, true); // msg_iovlen
  view.setBigUint64(32, libc.address(control), true); // msg_control
  view.setBigUint64(40, BigInt(CONTROL_SIZE), true); // msg_controllen
  let count: number;
  for (;;) {
    count = libc.recvmsg(fd, header, MSG_CMSG_CLOEXEC);
    if (count >= 0) break;
    const errno = libc.errno();
    if (errno !== EINTR) throw new SyscallError("recvmsg", errno);
  }
  const fds = descriptors(control, Number(view.getBigUint64(40, true)));
  if (view.getInt32(48, true) & MSG_CTRUNC) {
    for (const extra of fds) libc.close(extra);
    throw new SyscallError("recvmsg (the host sent more descriptors than a frame may carry)", 0);
  }
  // `iov`, `control` and `header` stay reachable until here: their addresses were in use.
  void iov;
  return { data: data.subarray(0, count), fds };
}

function descriptors(control: Uint8Array, length: number): number[] {
  const view = new DataView(control.buffer);
  const fds: number[] = [];
  let offset = 0;
  while (offset + CMSG_HEADER <= length) {
    const size = Number(view.getBigUint64(offset, true));
    if (size < CMSG_HEADER) break;
    const level = view.getInt32(offset + 8, true);
    const type = view.getInt32(offset + 12, true);
    if (level === SOL_SOCKET && type === SCM_RIGHTS) {
      for (let at = offset + CMSG_HEADER; at + 4 <= offset + size; at += 4) fds.push(view.getInt32(at, true));
    }
    offset += (size + 7) & ~7;
  }
  return fds;
}

/** Write all of `data` to the (blocking) descriptor `fd`. */
export function writeAll(libc: Libc, fd: number, data: Uint8Array): void {
  let offset = 0;
  while (offset < data.length) {
    const rest = data.subarray(offset);
    const written = libc.write(fd, rest, rest.length);
    if (written < 0) {
      const errno = libc.errno();
      if (errno === EINTR) continue;
      throw new SyscallError("write", errno);
    }
    offset += written;
  }
}

/** dup2 that retries on EINTR; throws SyscallError otherwise. */
export function dup2(libc: Libc, fd: number, target: number): void {
  while (libc.dup2(fd, target) < 0) {
    const errno = libc.errno();
    if (errno !== EINTR) throw new SyscallError("dup2", errno);
  }
}
