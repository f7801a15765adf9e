"""What every pyhpc plot shares (the scaling, pipeline and cluster reports): a row of
panels, and a save that never follows a link."""
from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pyhpc import files


def figure(panels: int) -> tuple[Any, Any]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, panels, figsize=(5 * panels, 4), squeeze=False)
    return fig, axes[0]


def clock_axis(ax: Any, start: datetime, end: datetime) -> None:
    """x from ``start`` to ``end`` in clock times, UTC (HH:MM), with the date where the
    two are on different days."""
    from matplotlib import dates

    one_day = start.astimezone(UTC).date() == end.astimezone(UTC).date()
    ax.xaxis.set_major_locator(dates.AutoDateLocator(  # type: ignore[no-untyped-call]
        tz=UTC, maxticks=6))  # untyped in matplotlib's stubs
    ax.xaxis.set_major_formatter(dates.DateFormatter(  # type: ignore[no-untyped-call]
        "%H:%M" if one_day else "%m-%d\n%H:%M", tz=UTC))
    ax.set_xlim(start, end)
    ax.set_xlabel("time (UTC)")


def save(fig: Any, path: Path, integer_x: bool = True) -> Path:
    """Write through a temp file renamed over ``path`` (never through a link); a missing
    parent directory is created, one that cannot be is a one-line FileError. ``integer_x``:
    whole-number ticks on x (workers, nodes); a legend where a panel labels its lines."""
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    for ax in fig.axes:
        if integer_x:
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(True, alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize="small")
    fig.tight_layout()
    try:
        if not path.parent.is_dir():  # an existing one (or a link to one) is used as it is
            files.make_dir(path.parent, arg="png")
        files.write_with(path, lambda fh: fig.savefig(fh, format="png", dpi=100,
                                                      metadata={"Software": None}), arg="png")
    finally:
        plt.close(fig)
    return path
