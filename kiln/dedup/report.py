"""Markdown views of the dedup decisions for the Dagster UI: who duplicates whom, cluster sizes, examples."""

from __future__ import annotations

import math

import pyarrow as pa


def cross_source_markdown(matrix: dict[str, dict[str, int]]) -> str:
    """Rows: the source of the removed copy; columns: the source of the kept one."""
    if not matrix:
        return "no near-duplicates"
    kept_sources = sorted({k for row in matrix.values() for k in row})
    lines = ["| removed from ↓ / kept in → | " + " | ".join(kept_sources) + " |",
             "|---|" + "---:|" * len(kept_sources)]
    for removed in sorted(matrix):
        lines.append(f"| {removed} | " + " | ".join(f"{matrix[removed].get(k, 0):,}" for k in kept_sources) + " |")
    return "\n".join(lines)


def cluster_sizes_markdown(sizes: dict[int, int], width: int = 40) -> str:
    if not sizes:
        return "no clusters"
    top = max(sizes.values())
    lines = ["documents per cluster (kept + removed):", "```"]
    for size, n in sorted(sizes.items()):
        lines.append(f"{size:>6} {'█' * math.ceil(width * n / top):<{width}} {n:,}")
    lines.append("```")
    return "\n".join(lines)


def clusters_markdown(decisions: pa.Table, cluster_ids: list[str], texts: dict[str, str] | None,
                      excerpt: int = 160) -> str:
    """The largest clusters, kept document first, each member with its Jaccard and (`texts` given: the removed
    documents' text may be shown, kiln.common.removals) an excerpt."""
    if not cluster_ids:
        return "no clusters"
    rows = [r for r in decisions.to_pylist() if r["cluster_id"] in set(cluster_ids)]
    out = []
    for cid in cluster_ids:
        members = sorted((r for r in rows if r["cluster_id"] == cid), key=lambda r: r["duplicate_of"] is not None)
        out += [f"**cluster `{cid}`** ({len(members)} documents in this run)", "",
                "| document | source | status | Jaccard with kept |" + (" excerpt |" if texts is not None else ""),
                "|---|---|---|---:|" + ("---|" if texts is not None else "")]
        for r in members:
            score = f"{r['jaccard']:.3f}" if r["jaccard"] is not None else ""
            line = f"| `{r['doc_id']}` | {r['source']} | {r['status']} | {score} |"
            if texts is not None:
                text = " ".join(texts.get(r["doc_id"], "(text not in the current curated sets)").split())[:excerpt]
                line += f" {text.replace('|', chr(92) + '|')} |"
            out.append(line)
        out.append("")
    return "\n".join(out)
