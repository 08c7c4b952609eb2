"""Audit answers as text for a terminal: `kiln audit` without --json (the JSON is each answer's `to_dict`).

`render(answer)` picks the function for the answer's type: a checkpoint's lineage, a document's membership, a
source's usage, the refresh report, or a sample of what a rule removed. Each shows a control or bidi formatting
character from the data (a removed document's text or URL, a name) as its escape (kiln.common.display): in a terminal,
ESC starts a sequence that retitles the window, clears the screen or recolours what follows.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import singledispatch, wraps
from typing import Any

from kiln.common.display import visible
from kiln.common.manifest import to_the_second
from kiln.governance.audit import Lineage, RefreshReport, SourceUsage
from kiln.governance.catalog import NOT_MATERIALIZED, RAW, node_key
from kiln.governance.membership import Membership
from kiln.governance.rejected import RejectedSample


@singledispatch
def render(answer: Any) -> str:
    """An audit's answer as text; `files_per_node` for a lineage (see `render_lineage`)."""
    raise TypeError(f"not an audit answer: {type(answer).__name__}")


def _shown(render_one: Callable[..., str]) -> Callable[..., str]:
    """The answer's text as a terminal may print it: its unseen characters (but line breaks and tabs) as escapes."""
    @wraps(render_one)
    def shown(answer: Any, *args: Any, **kwargs: Any) -> str:
        return visible(render_one(answer, *args, **kwargs))
    return shown


@render.register(Lineage)
@_shown
def render_lineage(answer: Lineage, files_per_node: int = 3) -> str:
    """The chain as an indented tree from the target; a dataset reached twice is shown once."""
    by_key = {n.key: n for n in answer.nodes}
    lines = [f"Lineage of {answer.target} ({len(answer.nodes)} datasets, store {answer.store})"]
    shown: set[str] = set()

    def walk(key: str, indent: int) -> None:
        n, pad = by_key[key], "  " * indent
        if key in shown:
            lines.append(f"{pad}{key}  {n.data_version or NOT_MATERIALIZED}  (listed above)")
            return
        shown.add(key)
        if n.status == NOT_MATERIALIZED:
            lines.append(f"{pad}{key}  NOT MATERIALIZED (recorded {', '.join(n.recorded_versions)})")
            return
        flag = {"superseded": "  SUPERSEDED", "replaced": f"  REPLACED since (now {n.current_version or 'none'})"}.get(
            n.status, "")
        lines.append(f"{pad}{key}  {n.data_version}{flag}  created {to_the_second(n.created_at)}  "
                     f"code {n.code_version}  git {_short_commit(n.git_commit)}")
        if n.counts:
            lines.append(f"{pad}    counts " + ", ".join(f"{k}={v:,}" for k, v in n.counts.items()))
        described = [f"{f['path']} sha256:{f['sha256'][:16]}" for f in n.files[:files_per_node]]
        more = f" +{len(n.files) - files_per_node} more" if len(n.files) > files_per_node else ""
        lines.append(f"{pad}    files {len(n.files)} ({_size(n.bytes)}): " + ", ".join(described) + more)
        for child in sorted(n.inputs):
            walk(child, indent + 1)

    walk(answer.nodes[0].key, 0)
    refreshes: dict[str, list[str]] = {}  # source -> the refreshes of its raw documents reached
    for p in answer.partitions(RAW):
        if by_key[node_key(RAW, p)].status != NOT_MATERIALIZED:
            source, _, refresh = str(p).partition("/")
            refreshes.setdefault(source, []).append(refresh)
    lines.append("raw sources reached: " + (", ".join(f"{s} ({', '.join(r)})" for s, r in sorted(refreshes.items()))
                                            or "none"))
    lines += [f"warning: {p}" for p in answer.problems]
    if answer.base:
        b = answer.base
        lines.append(f"continued pretraining from base checkpoint {b['kind']} sha256:{b['sha256'][:16]} "
                     f"({b['path']}; tokenizer {str(b['tokenizer_sha256'])[:12]}, trained on {b['trained_on']})")
        chain = (b.get("chain") or {}).get("text")
        lines += ["  " + line for line in chain.splitlines()] if chain else [
            "  its chain is unknown: the base came from outside this store"]
    return "\n".join(lines)


def _short_commit(commit: str | None) -> str:
    if not commit:
        return "unknown"
    return commit[:12] + ("-dirty" if commit.endswith("-dirty") else "")


def _size(n: int) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1000 or unit == "GB":
            return f"{n:,.0f} {unit}" if unit == "B" else f"{n:,.1f} {unit}"
        n /= 1000
    return f"{n} B"


@render.register(Membership)
@_shown
def render_membership(answer: Membership) -> str:
    lines = [answer.summary]
    if answer.match == "near_duplicate":
        lines.append(f"matched as a near-duplicate of {answer.doc_id}: exact Jaccard {answer.jaccard:.3f} of the "
                     f"shingle sets (found through the MinHash index)")
    elif answer.match == "exact":
        lines.append(f"matched exactly (text hash after exact dedup's case and whitespace folding): {answer.doc_id}")
    if answer.doc_id:
        arrived = f", refresh {answer.refresh}" if answer.refresh else ""
        lines.append(f"document {answer.doc_id} (source {answer.source}{arrived}, license {answer.license or 'unknown'})")
    if answer.stages:
        lines.append("stages:")
        width = max(len(f"{r.stage}[{r.source}]") for r in answer.stages)
        for r in answer.stages:
            where = f"{r.stage}[{r.source}]" if r.source else r.stage
            detail = ""
            if r.status in ("removed", "quarantined"):
                detail = f"  step {r.step}, reason {r.reason}" if r.step else f"  reason {r.reason}"
                if r.duplicate_of:
                    detail += f", duplicate of {r.duplicate_of}"
                if r.jaccard is not None:
                    detail += f" (Jaccard {r.jaccard:.3f})"
            version = f"  {r.data_version}" if r.data_version else ""
            lines.append(f"  {where:<{width}}  {r.status:<16}{version}{detail}".rstrip())
    for s in answer.shards:
        ckpts = ", ".join(c + _how_read(s, c) for c in s.checkpoints) or "none in the store"
        held = f"left out by {s.removed_by}" if s.removed_by else \
            f"split {s.split}, {s.copies} cop{'y' if s.copies == 1 else 'ies'} x {s.tokens:,} tokens"
        skipped = f"; skipped in the replay of checkpoint {', '.join(s.removed_from_replay)} by " \
                  f"{s.removed_from_replay_by}" if s.removed_from_replay else ""
        if s.held_out_of_replay:
            skipped += (f"; left out of the replay of checkpoint {', '.join(s.held_out_of_replay)} as its validation "
                        f"(its base trained on it)")
        lines.append(f"token_shards {s.shard_set}: {held}; checkpoints: {ckpts}{skipped}")
    for o in answer.other_matches:
        lines.append(f"also the same text: {o['doc_id']} ({o['source']}): {o['verdict']}")
    lines += [f"note: {n}" for n in answer.notes]
    return "\n".join(lines)


def _how_read(s, checkpoint: str) -> str:
    """` (replay, read 3 times: 2, 1 by copy)`: how a checkpoint used a shard set's copies of the document."""
    tags = ["replay"] if checkpoint in s.replayed_by else []
    if checkpoint in s.not_reached_by:
        tags.append("not reached" + (f": its run read {s.read_share[checkpoint]:.1%} of the set"
                                     if checkpoint in s.read_share else ""))
    elif checkpoint in s.reads:
        tags.append(s.times(checkpoint)[2:-1])
    return f" ({', '.join(tags)})" if tags else ""


@render.register(SourceUsage)
@_shown
def render_source_usage(answer: SourceUsage) -> str:
    lines = [f"Source {answer.source} (license {answer.license or 'unknown'}, domain {answer.domain or 'unknown'})",
             "documents per stage and refresh:"]
    width = max(len(f"{s['stage']}[{s.get('refresh')}]") for s in answer.stages)
    for s in answer.stages:
        if s.get("status") == NOT_MATERIALIZED:
            lines.append(f"  {s['stage']:<{width}} {NOT_MATERIALIZED}")
        else:
            lines.append(f"  {s['stage'] + '[' + s['refresh'] + ']':<{width}} {s['documents']:>8,} kept "
                         f"{s['rejected']:>7,} removed  {s['data_version']}")
    if not answer.shard_sets:
        lines.append("token shards: none in the store use this source")
    for u in answer.shard_sets:
        replaced = ", replaced in the store since" if u.replaced else ""
        lines.append(f"token_shards {u.data_version} ({to_the_second(u.created_at)}{replaced}): "
                     f"{u.train_tokens:,} train tokens ({u.share_of_train_tokens:.1%} of the set, "
                     f"{u.effective_epochs:.2f} epochs of "
                     f"{u.natural_train_tokens:,}), {u.val_tokens:,} val tokens; documents {u.train_documents:,} "
                     f"train / {u.val_documents:,} val")
        train = [s for s in u.shards if s["split"] == "train"]
        val = [s for s in u.shards if s["split"] == "val"]
        for label, group in (("train", train), ("val", val)):
            if group:
                shown = ", ".join(f"{s['path']} ({s['tokens']:,})" for s in group[:4])
                more = f" +{len(group) - 4} more" if len(group) > 4 else ""
                lines.append(f"  {label} shards with this source: {len(group)}: {shown}{more}")
        for c in u.checkpoints:
            lines.append(f"  checkpoint {c['data_version']} ({to_the_second(c['created_at'])}): {c['steps']} steps, "
                         f"MLflow run {c['mlflow_run_id'] or 'unknown'}")
        if not u.checkpoints:
            lines.append("  checkpoints: none in the store trained on this shard set")
    lines += [f"note: {n}" for n in answer.notes]
    return "\n".join(lines)


@render.register(RefreshReport)
@_shown
def render_refresh_report(answer: RefreshReport) -> str:
    lines = [f"{len(answer.refreshes)} refresh(es); landing area {answer.landing}"]
    for r in answer.refreshes:
        files = "the configured sources" if r["landed_files"] is None else \
            "; ".join(f"{s}: {', '.join(fs[:3])}" + (f" +{len(fs) - 3} more" if len(fs) > 3 else "")
                      for s, fs in r["landed_files"].items()) or "no files"
        shards = f"token_shards {r['token_shards']}" if r["token_shards"] else "token_shards not materialized"
        lines.append(f"{r['key']}  registered {to_the_second(r['created_at'])} by {r['trigger']}: {files}; {shards}")
        for source, n in r["sources"].items():
            lines.append(f"  {source:<20} {n['raw_records']:>8,} raw records -> {n['documents']:>8,} documents"
                         if n else f"  {source:<20} not materialized")
    for source, files in answer.pending.items():
        lines.append(f"pending for {source}: {', '.join(files)} (the next sensor tick or scheduled refresh "
                     f"registers them)")
    lines += [f"warning: landing folder {u!r} names no declared source; its files are left alone"
              for u in answer.unknown_sources]
    return "\n".join(lines)



@render.register(RejectedSample)
@_shown
def render_rejected(answer: RejectedSample) -> str:
    removed = ", ".join(f"{s} {n:,}" for s, n in answer.removed.items())
    lines = [f"{answer.stage}, reason {answer.reason}: {sum(answer.removed.values()):,} documents removed ({removed}); "
             f"{len(answer.shown)} shown, excerpts PII-redacted from {RAW}"]
    if answer.withheld:
        lines.append(f"({answer.withheld} more under a removal request: never shown)")
    if answer.raw_unreadable:
        lines.append(f"(no excerpts: {answer.raw_unreadable})")
    for r in answer.shown:
        lines.append(f"\n{r['doc_id']}  [{r['source']} {r['refresh']}]  {r['reason']}  {r['chars']:,} chars"
                     + (f"  {r['url']}" if r["url"] else ""))
        if r["excerpt"] is not None:
            lines.append("  " + r["excerpt"].replace("\n", "\n  ") + (" …" if r["chars"] > len(r["excerpt"]) else ""))
    if answer.other_reasons:
        lines.append("\nother reasons at this stage: " + ", ".join(f"{r} ({n:,})" for r, n in answer.other_reasons.items()))
    return "\n".join(lines)


__all__ = ["render", "render_lineage", "render_membership", "render_refresh_report", "render_rejected", "render_source_usage"]
