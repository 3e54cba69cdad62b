/**
 * Typed frames between host and sandbox: the TypeScript twin of the Python runner's frames.py.
 *
 * A frame is a 10-byte header and a JSON body:
 *
 *     magic  "MSBX"   4 bytes
 *     version         1 byte   (PROTOCOL_VERSION)
 *     kind            1 byte   (Kind)
 *     length          4 bytes  big-endian, body length in bytes
 *     body            UTF-8 JSON object
 *
 * A reader rejects a wrong magic, another version, an unknown kind, an oversized or non-object
 * body with FrameError; the stream cannot be resynchronised after one.
 */

export const PROTOCOL_VERSION = 3; // frames.py's PROTOCOL_VERSION (a unit test keeps them equal)
export const HEADER_SIZE = 10;
export const DEFAULT_MAX_FRAME = 256 * 1024 * 1024;
const MAGIC = [0x4d, 0x53, 0x42, 0x58]; // "MSBX"

/** Frame kinds. Direction: H = host, S = sandbox (see frames.py for the bodies). */
export enum Kind {
  READY = 1, // S->H
  EXEC = 2, // H->S, with the run's stdout and stderr pipes attached
  DONE = 3, // S->H
  CALL = 4, // S->H
  REPLY = 5, // H->S
  ERROR = 6, // both
  DISPLAY = 7, // S->H
  EXITED = 8, // S->H, from a Python zygote only
  VERDICT = 9, // H->S, to a Python runtime only (a resumed session's state checked)
}

export type Body = Record<string, unknown>;
export type Frame = [Kind, Body];

export class FrameError extends Error {
  override name = "FrameError";
}

const encoder = new TextEncoder();
const decoder = new TextDecoder("utf-8", { fatal: true });

/** Serialise one frame. */
export function encode(kind: Kind, body: Body): Uint8Array {
  const payload = encoder.encode(JSON.stringify(body));
  const frame = new Uint8Array(HEADER_SIZE + payload.length);
  frame.set(MAGIC, 0);
  const view = new DataView(frame.buffer);
  view.setUint8(4, PROTOCOL_VERSION);
  view.setUint8(5, kind);
  view.setUint32(6, payload.length, false);
  frame.set(payload, HEADER_SIZE);
  return frame;
}

function isKind(value: number): value is Kind {
  return value >= Kind.READY && value <= Kind.VERDICT;
}

/** Frames out of a byte stream fed in pieces of any size. */
export class FrameParser {
  private chunks: Uint8Array[] = [];
  private size = 0;
  private header: [Kind, number] | null = null;

  constructor(private readonly maxSize: number = DEFAULT_MAX_FRAME) {}

  feed(data: Uint8Array): void {
    if (data.length) {
      this.chunks.push(data);
      this.size += data.length;
    }
  }

  get buffered(): number {
    return this.size;
  }

  /** How many more bytes the frame being read needs (at least 1). */
  wanted(): number {
    if (this.header === null) return Math.max(1, HEADER_SIZE - this.size);
    return Math.max(1, HEADER_SIZE + this.header[1] - this.size);
  }

  private take(count: number): Uint8Array {
    const joined = new Uint8Array(count);
    let filled = 0;
    while (filled < count) {
      const first = this.chunks[0]!;
      const part = Math.min(first.length, count - filled);
      joined.set(first.subarray(0, part), filled);
      filled += part;
      if (part === first.length) this.chunks.shift();
      else this.chunks[0] = first.subarray(part);
    }
    this.size -= count;
    return joined;
  }

  /** The next whole frame, or null until more bytes are fed. Throws FrameError. */
  next(): Frame | null {
    if (this.header === null) {
      if (this.size < HEADER_SIZE) return null;
      this.header = parseHeader(this.take(HEADER_SIZE), this.maxSize);
    }
    const [kind, length] = this.header;
    if (this.size < length) return null;
    this.header = null;
    return [kind, decodeBody(this.take(length))];
  }

  /** Call at the end of the stream: throws FrameError when it ended inside a frame. */
  checkEnd(): void {
    if (this.size || this.header !== null) throw new FrameError("channel closed in the middle of a frame");
  }
}

function parseHeader(header: Uint8Array, maxSize: number): [Kind, number] {
  if (!MAGIC.every((byte, index) => header[index] === byte)) throw new FrameError("bad frame magic");
  const view = new DataView(header.buffer, header.byteOffset, header.length);
  const version = view.getUint8(4);
  if (version !== PROTOCOL_VERSION) {
    throw new FrameError(`protocol version ${version} is not supported (this side speaks ${PROTOCOL_VERSION})`);
  }
  const kind = view.getUint8(5);
  if (!isKind(kind)) throw new FrameError(`unknown frame kind ${kind}`);
  const length = view.getUint32(6, false);
  if (length > maxSize) throw new FrameError(`frame of ${length} bytes exceeds the limit of ${maxSize} bytes`);
  return [kind, length];
}

function decodeBody(payload: Uint8Array): Body {
  let body: unknown;
  try {
    body = JSON.parse(decoder.decode(payload));
  } catch (error) {
    throw new FrameError(`frame body is not JSON: ${(error as Error).name}`);
  }
  if (typeof body !== "object" || body === null || Array.isArray(body)) {
    throw new FrameError("frame body is not a JSON object");
  }
  return body as Body;
}
