"""The matplotlib backend of the runner: Agg, with ``show()`` sending each open figure as a PNG.

Selected by ``display`` once matplotlib is imported in the runner's process (never through
``MPLBACKEND``, which subprocesses would inherit without being able to import this module).
"""

from __future__ import annotations

import io
from typing import Any

# matplotlib exists only in the sandbox's runtime, not in the host's type-checking environment.
from matplotlib._pylab_helpers import Gcf  # type: ignore[import-not-found,unused-ignore]
from matplotlib.backend_bases import FigureManagerBase  # type: ignore[import-not-found,unused-ignore]
from matplotlib.backends.backend_agg import FigureCanvasAgg  # type: ignore[import-not-found,unused-ignore]

from .display import emit

__all__ = ["FigureCanvas", "FigureManager", "show"]

FigureCanvas = FigureCanvasAgg
FigureManager = FigureManagerBase


def show(*args: Any, **kwargs: Any) -> None:
    """Send every open figure to the host as a PNG, then close it (as a notebook shows a cell's figures)."""
    for manager in Gcf.get_all_fig_managers():
        buffer = io.BytesIO()
        manager.canvas.figure.savefig(buffer, format="png")
        emit("image/png", buffer.getvalue())
        Gcf.destroy(manager)
