"""Charts as PNGs inside markdown metadata: the Dagster UI renders them where a table would be read row by row."""

from __future__ import annotations

import base64
import io


def pyplot():
    import matplotlib

    matplotlib.use("Agg")  # no display: render to memory
    import matplotlib.pyplot as plt

    return plt


def figure_markdown(fig, alt: str) -> str:
    """The figure as a markdown image (a base64 PNG), closed after rendering."""
    plt = pyplot()
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png")
    plt.close(fig)
    return f"![{alt}](data:image/png;base64,{base64.b64encode(buffer.getvalue()).decode()})"


def stacked_bars_markdown(rows: dict[str, dict[str, float]], title: str, ylabel: str) -> str:
    """One bar per refresh (in order), stacked by source: how each refresh changed a figure."""
    plt = pyplot()
    refreshes = list(rows)
    sources = sorted({s for r in rows.values() for s in r})
    fig, ax = plt.subplots(figsize=(6, 2.8), dpi=100)
    bottom = [0.0] * len(refreshes)
    for source in sources:
        values = [rows[r].get(source, 0) for r in refreshes]
        ax.bar(refreshes, values, bottom=bottom, label=source)
        bottom = [b + v for b, v in zip(bottom, values)]
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7, loc="upper left")
    ax.tick_params(axis="x", labelsize=7, rotation=30)
    return figure_markdown(fig, title)
