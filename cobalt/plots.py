"""Figures drawn off-screen: the one place that picks matplotlib's backend and closes figures
(matplotlib is imported only when a plot is drawn)."""

from __future__ import annotations

import io
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any


@contextmanager
def figure(*args: Any, **kwargs: Any) -> Iterator[tuple[Any, Any]]:
    """`plt.subplots(*args, **kwargs)` on the Agg backend, as `(fig, axes)`; the figure is closed
    on leaving, also after an error while drawing."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(*args, **kwargs)
    try:
        yield fig, axes
    finally:
        plt.close(fig)


def png(fig: Any) -> bytes:
    """The figure as PNG bytes, trimmed to what is drawn."""
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", bbox_inches="tight")
    return buffer.getvalue()
