"""Charts as PNGs inside markdown metadata: the Dagster UI renders them where a table would be read row by row."""

from __future__ import annotations

import base64
import io


def pyplot():
    import matplotlib

    matplotlib.use("Agg")  # no display: render to memory
    import matplotlib.pyplot as plt

    return plt


def figure_png(fig) -> bytes:
    """The figure as PNG bytes, closed after rendering (a file next to a markdown page that links it)."""
    plt = pyplot()
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png")
    plt.close(fig)
    return buffer.getvalue()


def png_markdown(png: bytes, alt: str) -> str:
    """PNG bytes as a markdown image inlined as base64 (the Dagster UI shows no files beside its metadata)."""
    return f"![{alt}](data:image/png;base64,{base64.b64encode(png).decode()})"


def figure_markdown(fig, alt: str) -> str:
    """The figure as a markdown image (a base64 PNG), closed after rendering."""
    return png_markdown(figure_png(fig), alt)


def stacked_bars_markdown(rows: dict[str, dict[str, float]], title: str, ylabel: str) -> str:
    """One bar per refresh (in order), stacked by source: how each refresh changed a figure."""
    return figure_markdown(stacked_bars(rows, title, ylabel), title)


def stacked_bars(rows: dict[str, dict[str, float]], title: str, ylabel: str, legend: str = "upper left"):
    """One bar per key of `rows` (in order: refreshes, stages), stacked by source; the figure."""
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
    ax.legend(fontsize=7, loc=legend)
    ax.tick_params(axis="x", labelsize=7, rotation=30)
    return fig
