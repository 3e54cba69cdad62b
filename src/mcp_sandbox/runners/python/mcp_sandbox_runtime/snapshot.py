"""A fork's state as bytes: laid out so that it is written without copies and read straight into place.

``fork.py`` decides what is carried; this module lays it out. Large binary buffers (a numpy
array's data, a DataFrame's columns: pickle protocol 5's out-of-band buffers) come first, raw,
each written from the object's own memory; then each variable's pickle, the index (a pickle:
what each variable is, how many buffers it takes) and a table of the buffers' sizes; the last
bytes give the lengths of all three and a mark. Its end says where it begins, so what a thread
of the source wrote to the same stdout before the dump is not taken for it.

Reading (:func:`read`) takes a descriptor of the state's file and reads every byte into memory
of this process, each large buffer into a mapping of its own (anonymous, so it is counted in the
sandbox's memory; populated as it is made, cheaper than a page fault per page during the read),
before anything of it is unpickled: the caller closes the descriptor before a single object of
the state (whose ``__setstate__`` may be the session's own code) is made. The sizes table is
plain integers for that reason: the layout is known without unpickling anything.

``mapped`` (a resumed session's parked state, which the server keeps, counted in the
conversation's quota, for as long as the session lives): the file is mapped copy-on-write
(``MAP_PRIVATE``, populated read-only, then made writable) instead, and each large buffer is a
view of that mapping: no page is allocated or copied until the session writes it, and nothing
the session writes reaches the file. The mapping outlives the descriptor, which is closed as before.
The earlier layout (format 2: the variables' pickles, the index, two lengths and another mark)
is still read, so a state parked before an upgrade is resumed after it.
"""

from __future__ import annotations

import mmap
import os

from .records import record

__all__ = ["HUGE", "Unpacked", "pack", "read", "unpack"]

MARK = b"\x00mcp-sandbox-frk3"
_LEGACY_MARK = b"\x00mcp-sandbox-fork"  # format 2: index and values lengths, then this mark
_TRAILER = 24 + len(MARK)  # the buffer count, the index's and the values' lengths, the mark
_LEGACY_TRAILER = 16 + len(_LEGACY_MARK)
# A buffer this large is read into a mapping of its own.
HUGE = 2 << 20
_MAX_IOV = 512  # vectors per preadv (IOV_MAX is 1024 on Linux)


@record(frozen=True, slots=True)
class Unpacked:
    """A state read into memory, nothing of it unpickled: the index's pickle, the variables' pickles
    one after the other, and the out-of-band buffers in order (writable)."""

    index: bytes | memoryview
    values: bytes | memoryview
    buffers: tuple[bytearray | mmap.mmap | memoryview, ...]


def pack(buffers: list[memoryview], values: list[bytes], index: bytes) -> list[memoryview | bytes]:
    """The pieces of a state, to be written in order (``buffers`` are not copied)."""
    sizes = b"".join(buffer.nbytes.to_bytes(8, "big") for buffer in buffers)
    blob = sum(len(data) for data in values)
    lengths = len(buffers).to_bytes(8, "big") + len(index).to_bytes(8, "big") + blob.to_bytes(8, "big")
    return [*buffers, *values, index, sizes + lengths + MARK]


def _layout(tail: bytes | memoryview, size: int) -> tuple[int, int, int, int] | None:
    """(buffer count, index length, values length, start of the sizes table) from a state's last bytes."""
    if size < _TRAILER or bytes(tail[-len(MARK) :]) != MARK:
        return None
    count = int.from_bytes(tail[-_TRAILER : -_TRAILER + 8], "big")
    index = int.from_bytes(tail[-_TRAILER + 8 : -_TRAILER + 16], "big")
    values = int.from_bytes(tail[-_TRAILER + 16 : -len(MARK)], "big")
    table = size - _TRAILER - 8 * count
    if table < 0 or index + values > table:
        raise ValueError("a snapshot cut short")
    return count, index, values, table


def _sizes(table: bytes | memoryview, count: int) -> list[int]:
    return [int.from_bytes(table[8 * i : 8 * i + 8], "big") for i in range(count)]


def _buffer(size: int) -> bytearray | mmap.mmap:
    if size < HUGE:
        return bytearray(size)
    # Its pages made in one call, not one fault each as the read reaches them.
    return mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | getattr(mmap, "MAP_POPULATE", 0))


def _read_into(fd: int, targets: list[bytearray | mmap.mmap], offset: int) -> None:
    """Fill ``targets`` from ``fd`` at ``offset`` on (preadv, batched; a short read resumed)."""
    views = [memoryview(target) for target in targets if len(target)]
    while views:
        batch = views[:_MAX_IOV]
        done = os.preadv(fd, batch, offset)
        if done <= 0:
            raise ValueError("a snapshot cut short")
        offset += done
        while done and views:
            if done >= views[0].nbytes:
                done -= views[0].nbytes
                views.pop(0)
            else:
                views[0] = views[0][done:]
                done = 0


def _pread(fd: int, size: int, offset: int) -> bytes:
    target = bytearray(size)
    _read_into(fd, [target], offset)
    return bytes(target)


def read(fd: int, size: int, *, mapped: bool = False) -> Unpacked:
    """The state in the first ``size`` bytes of the file ``fd``, read into memory, or its large
    buffers mapped with ``mapped`` (see the module's docstring).

    Raises:
        ValueError: it is not a state of this runtime, or cut short.
    """
    tail = _pread(fd, min(size, _TRAILER), size - min(size, _TRAILER))
    layout = _layout(tail, size)
    if layout is None:  # format 2, or nothing at all: read whole, as it was
        return unpack(_pread(fd, size, 0))
    count, index, values, table = layout
    sizes = _sizes(_pread(fd, 8 * count, table), count)
    start = table - index - values - sum(sizes)
    if start < 0:
        raise ValueError("a snapshot cut short")
    if mapped and start % 8 == 0 and sum(sizes) >= HUGE:
        return _mapped(fd, start, sizes, values, index)
    buffers = [_buffer(length) for length in sizes]
    pickles = bytearray(values + index)
    _read_into(fd, [*buffers, pickles], start)
    view = memoryview(pickles)
    return Unpacked(view[values:], view[:values], tuple(buffers))


def _mapped(fd: int, start: int, sizes: list[int], values: int, index: int) -> Unpacked:
    """A state whose buffers begin at ``start``, those of :data:`HUGE` bytes or more views of a private mapping."""
    offset = start % mmap.ALLOCATIONGRANULARITY  # a mapping begins on a page
    end = start + sum(sizes)
    mapping = _map_private(fd, start - offset, end - start + offset)
    buffers: list[bytearray | mmap.mmap | memoryview] = []
    for length in sizes:
        piece = mapping[offset : offset + length]
        buffers.append(piece if length >= HUGE else bytearray(piece))
        offset += length
    pickles = bytearray(values + index)
    _read_into(fd, [pickles], end)
    view = memoryview(pickles)
    return Unpacked(view[values:], view[:values], tuple(buffers))


def _map_private(fd: int, at: int, length: int) -> memoryview:
    """``length`` bytes of ``fd`` from ``at`` (a page's start) mapped copy-on-write and populated, writable; unmapped
    once nothing refers to it. Not ``mmap.mmap``: before Python 3.13 it keeps a duplicate of the
    descriptor for as long as the mapping lives, within reach of the session's code."""
    import ctypes
    import weakref

    from .kernel import libc

    lib = libc()
    lib.mmap.restype = ctypes.c_void_p
    lib.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    lib.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    lib.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    # Populated read-only, then made writable: populating a writable private mapping would copy
    # every page (the kernel breaks copy-on-write as it populates); this way a page is copied
    # only when the session writes it.
    flags = mmap.MAP_PRIVATE | getattr(mmap, "MAP_POPULATE", 0)
    address = lib.mmap(None, length, mmap.PROT_READ, flags, fd, at)
    if address is None or address == ctypes.c_void_p(-1).value:
        error = ctypes.get_errno()
        raise OSError(error, os.strerror(error))
    if lib.mprotect(address, length, mmap.PROT_READ | mmap.PROT_WRITE) != 0:
        error = ctypes.get_errno()
        lib.munmap(address, length)
        raise OSError(error, os.strerror(error))
    pages = (ctypes.c_ubyte * length).from_address(address)
    weakref.finalize(pages, lib.munmap, address, length)
    return memoryview(pages).cast("B")


def unpack(state: bytes | memoryview) -> Unpacked:
    """A state held in memory (either format), as :func:`read` gives it.

    Raises:
        ValueError: it is not a state of this runtime, or cut short.
    """
    view = memoryview(state)
    size = len(view)
    layout = _layout(view[-_TRAILER:] if size >= _TRAILER else view, size)
    if layout is not None:
        count, index, values, table = layout
        sizes = _sizes(view[table : table + 8 * count], count)
        start = table - index - values - sum(sizes)
        if start < 0:
            raise ValueError("a snapshot cut short")
        buffers: list[bytearray | mmap.mmap | memoryview] = []
        for length in sizes:
            buffers.append(bytearray(view[start : start + length]))
            start += length
        return Unpacked(view[start + values : start + values + index], view[start : start + values], tuple(buffers))
    if size < _LEGACY_TRAILER or bytes(view[-len(_LEGACY_MARK) :]) != _LEGACY_MARK:
        raise ValueError("not a snapshot of this runtime (no mark at its end)")
    index = int.from_bytes(view[-_LEGACY_TRAILER : -_LEGACY_TRAILER + 8], "big")
    blob = int.from_bytes(view[-_LEGACY_TRAILER + 8 : -len(_LEGACY_MARK)], "big")
    end = size - _LEGACY_TRAILER
    if index + blob > end:
        raise ValueError("a snapshot cut short")
    return Unpacked(view[end - index : end], view[end - index - blob : end - index], ())
