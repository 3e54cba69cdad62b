"""Images a run shows or saves, sent to the host as DISPLAY frames.

Once ``matplotlib`` is imported in this process (never in its subprocesses, which keep
``MPLBACKEND=Agg`` from the environment), a post-import hook selects our backend
(``mpl_backend``: ``plt.show()`` sends every open figure as a PNG and closes it) and wraps
``Figure.savefig`` so that a figure saved to a PNG/JPEG/GIF/WebP file is sent as well.
At most ``maxImages`` images of at most ``maxImageBytes`` each are sent per run; what is
left out is said on stderr. Nothing is sent between runs.
"""

from __future__ import annotations

import binascii
import os
import sys
from types import ModuleType
from typing import Any

from . import host
from .frames import Display

__all__ = ["BACKEND", "begin", "emit", "end", "install"]

BACKEND = "module://mcp_sandbox_runtime.mpl_backend"
_MIME_BY_SUFFIX = {
    "png": "image/png",
    "jpg": "image/jpeg",
    "jpeg": "image/jpeg",
    "gif": "image/gif",
    "webp": "image/webp",
}


class _Run:
    def __init__(self, run: int, max_images: int, max_bytes: int) -> None:
        self.run = run
        self.max_images = max_images
        self.max_bytes = max_bytes
        self.sent = 0


_current: _Run | None = None


def begin(run: int, max_images: int, max_bytes: int) -> None:
    """Start sending the images of run ``run``."""
    global _current
    _current = _Run(run, max_images, max_bytes)


def end() -> None:
    """Stop sending images (the run is over)."""
    global _current
    _current = None


def emit(mime: str, data: bytes) -> bool:
    """Send one image of the current run; False when it was left out (caps, no run, no host)."""
    run = _current
    if run is None:
        return False
    if run.sent >= run.max_images:
        why = f"this run already returned {run.max_images}" if run.max_images else "this server returns no images"
        sys.stderr.write(f"[mcp-sandbox: image not returned: {why}]\n")
        return False
    if len(data) > run.max_bytes:
        sys.stderr.write(
            f"[mcp-sandbox: image not returned: {len(data)} bytes is over the limit of {run.max_bytes} bytes]\n"
        )
        return False
    try:
        host.connection().send(Display(run.run, mime, binascii.b2a_base64(data, newline=False).decode()))
    except (OSError, host.HostUnavailable):
        return False
    run.sent += 1
    return True


def _saved_file(fname: Any, format: Any) -> tuple[str, str] | None:
    """The file ``savefig(fname, format=...)`` wrote and its mime type, if it is an image we return."""
    if not isinstance(fname, str | os.PathLike):
        return None  # a file object: the code keeps the bytes to itself
    path = os.fspath(fname)
    if not isinstance(path, str):
        return None
    suffix = os.path.splitext(path)[1][1:]
    if format:
        kind = str(format)
    elif suffix:
        kind = suffix
    else:
        # As matplotlib does: the default format, whose extension it appends to the name.
        kind = str(sys.modules["matplotlib"].rcParams["savefig.format"])
        path = f"{path.rstrip('.')}.{kind}"
    mime = _MIME_BY_SUFFIX.get(kind.lower())
    return (path, mime) if mime is not None else None


def _wrap_savefig(figure_module: ModuleType) -> None:
    import functools

    figure_class = figure_module.Figure
    original = figure_class.savefig
    if getattr(original, "_mcp_sandbox", False):
        return

    @functools.wraps(original)
    def savefig(self: Any, fname: Any, *args: Any, **kwargs: Any) -> Any:
        result = original(self, fname, *args, **kwargs)
        if _current is not None:
            saved = _saved_file(fname, kwargs.get("format"))
            if saved is not None:
                try:
                    with open(saved[0], "rb") as image:
                        data = image.read(_current.max_bytes + 1)
                except OSError:
                    return result
                emit(saved[1], data)
        return result

    savefig._mcp_sandbox = True  # type: ignore[attr-defined]
    figure_class.savefig = savefig


def _select_backend(matplotlib: ModuleType) -> None:
    # Only while pyplot is not imported yet does this merely set rcParams (no backend switch).
    if "matplotlib.pyplot" not in sys.modules:
        matplotlib.rcParams["backend"] = BACKEND


_HOOKS = {"matplotlib": _select_backend, "matplotlib.figure": _wrap_savefig}


class _PostImportHook:
    """A ``sys.meta_path`` finder that runs a hook right after certain modules are executed."""

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        hook = _HOOKS.get(name)
        if hook is None:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None:
                break
        else:
            return None
        loader = spec.loader
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        execute = loader.exec_module

        def exec_module(module: ModuleType) -> None:
            execute(module)
            try:
                hook(module)
            except Exception as error:  # matplotlib must import even if our hook fails
                sys.stderr.write(f"[mcp-sandbox: images from matplotlib are off: {error!r}]\n")

        loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


def install() -> None:
    """Install the matplotlib hooks (the runner calls this once, before any user code)."""
    if not any(isinstance(finder, _PostImportHook) for finder in sys.meta_path):
        sys.meta_path.insert(0, _PostImportHook())
    for name, hook in _HOOKS.items():
        module = sys.modules.get(name)
        if module is not None:
            hook(module)
