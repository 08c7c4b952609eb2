"""`kiln audit rejected`: a sample of what one rule removed, to judge the rule by eye.

A stage's rejected table keeps ids, urls, lengths and hashes, not text (kiln.common.removals). The text comes back
from `raw_documents`, the layer before any removal, which only users allowed to read raw data can open; each
excerpt is PII-redacted as `curation.keep_rejected_text: excerpt` would keep it. A document under a removal
request (`kiln forget`) is counted, never shown.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any

from kiln.common.removals import kept_text
from kiln.common.storage import Store
from kiln.governance.catalog import RAW, AuditError
from kiln.governance.forget import ForgetError, first_match, load_requests, with_intake_urls
from kiln.governance.lineage import DOCUMENT_STAGES
from kiln.governance.refresh import load_refreshes, materialized
from kiln.tokens.mixture import hash_unit

STAGES = DOCUMENT_STAGES[1:]  # the stages that remove documents (raw_documents quarantines unreadable records)


@dataclass
class RejectedSample:
    stage: str
    reason: str
    removed: dict[str, int]  # source -> documents the reason removed (every refresh asked for)
    shown: list[dict[str, Any]]  # doc_id, source, refresh, url, reason, chars, excerpt (None: raw layer unreadable)
    withheld: int = 0  # sampled documents under a removal request: not shown
    raw_unreadable: str | None = None  # why no excerpt could be read, if so
    other_reasons: dict[str, int] = field(default_factory=dict)  # the stage's other reasons, for a next question

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def matches(reason: str, asked: str) -> bool:
    """`gopher_quality` asks for every `gopher_quality.*` reason; `gopher_quality.min_stop_words` for that one;
    `removal_request` for every takedown's `removal_request:<id>`."""
    return reason == asked or reason.startswith((asked + ".", asked + ":"))


def rejected_sample(store: Store, stage: str, reason: str, sample: int, sources: list[str],
                    refresh: str | None = None) -> RejectedSample:
    """Up to `sample` documents `stage` removed for `reason` (a deterministic choice by doc_id hash), with their
    redacted raw excerpts, from `sources` in `refresh` (default: every registered refresh)."""
    if stage not in STAGES:
        raise AuditError(f"--stage {stage!r}: documents are removed at {', '.join(STAGES)}")
    refreshes = [r for r in load_refreshes(store) if refresh is None or r.key == refresh]
    if not refreshes:
        raise AuditError(f"--refresh {refresh!r}: no such refresh (`kiln audit refreshes` lists them)" if refresh
                         else "this store has no refresh yet: materialize the pipeline first (`make demo`)")
    rows, reasons = [], Counter()
    for part in materialized(store, stage, sources, refreshes):
        table = store.read_table(stage, part, "rejected", columns=["doc_id", "source", "url", "reason", "chars"])
        for row in table.to_pylist():
            reasons[row["reason"]] += 1
            if matches(row["reason"], reason):
                rows.append({**row, "partition": part, "refresh": part.rsplit("/", 1)[-1]})
    if not rows:
        known = ", ".join(f"{r} ({n})" for r, n in reasons.most_common()) or "none"
        raise AuditError(f"--reason {reason!r}: {stage} removed no document for it; its reasons: {known}")
    rows.sort(key=lambda r: hash_unit("audit-rejected", r["doc_id"]))
    requests, _ = load_requests(store)
    try:  # a URL pattern is matched against the URL as read (the rows' are redacted)
        requests = with_intake_urls(store, requests, sorted({r["partition"] for r in rows}))
    except ForgetError:  # the raw layer is not readable by this user: no text is shown either (below)
        pass
    chosen, withheld = [], 0
    for r in rows:
        if len(chosen) == sample:
            break
        if first_match(requests, r["doc_id"], r["source"], r["url"]) is None:
            chosen.append(r)
        else:
            withheld += 1
    texts, unreadable = {}, None
    try:
        for part in sorted({r["partition"] for r in chosen}):
            texts |= store.values(RAW, part, "text", {r["doc_id"] for r in chosen if r["partition"] == part})
    except PermissionError as exc:  # the raw layer is access-controlled: the ids and urls still answer
        unreadable = f"the raw layer is not readable by this user ({exc.filename}); ask its owner for access"
    shown = [{"doc_id": r["doc_id"], "source": r["source"], "refresh": r["refresh"], "url": r["url"],
              "reason": r["reason"], "chars": r["chars"],
              "excerpt": kept_text(texts[r["doc_id"]], "excerpt") if r["doc_id"] in texts else None}
             for r in chosen]
    return RejectedSample(stage, reason, dict(Counter(r["source"] for r in rows)), shown, withheld, unreadable,
                          {r: n for r, n in reasons.most_common() if not matches(r, reason)})

