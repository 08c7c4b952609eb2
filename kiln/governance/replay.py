"""Replay and removal requests: what a continued run may not read from the base run's token shards.

Continued pretraining replays the base run's token-shard folder as it was written (`mixture.replay`). A removal
request recorded since (`kiln forget`) is applied to it here, with the same matching the token_shards asset uses
(`RemovalRequest.matches` on doc_id, source and URL): the replayed set's member list says which documents it
holds, its position list (`positions-*.parquet`) where each copy sits, and the training loader is handed those
places so no sequence holding one of their tokens is read (training_jobs.loader, `exclude`).

The training run records what it replayed and what it left out: the replayed set is an input of its manifest
(`token_shards/<refresh>`, when the folder is this store's), `stats.replay` says which set, which requests and
how much was removed, and `replay_removed.parquet` in the run's dataset lists the documents (doc_id, source, the
request). Lineage, membership, `affected_checkpoints` and the data card read them back from there.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from kiln.common.manifest import MANIFEST_NAME, Manifest
from kiln.common.storage import Store, write_parquet_atomic
from kiln.governance.catalog import run_file
from kiln.governance.forget import REQUESTS, RemovalRequest, first_match, raw_partitions, with_intake_urls
from kiln.tokens.shard_format import TRAIN

SHARDS = "token_shards"
REMOVED_FILE = "replay_removed.parquet"
REMOVED_SCHEMA = pa.schema([pa.field("doc_id", pa.string(), nullable=False),
                            pa.field("source", pa.string(), nullable=False),
                            pa.field("removed_by", pa.string(), nullable=False),  # `removal_request:<id>`
                            pa.field("copies", pa.int32(), nullable=False),  # copies the replayed set holds
                            pa.field("tokens", pa.int64(), nullable=False)])  # per copy


class ReplayError(ValueError):
    """Replay data that cannot honour the removal requests as it is; the message says what to do."""


@dataclass
class ReplayPlan:
    """A replayed shard set and what the removal requests take out of it."""

    dataset_dir: str
    data_version: str
    input_key: str | None  # `token_shards/<refresh>` when the folder is this store's dataset; else None
    requests: list[str]  # ids of the requests applied (every request recorded when the run starts)
    removed: list[dict[str, Any]] = field(default_factory=list)  # REMOVED_SCHEMA rows
    exclude: dict[str, list[int]] = field(default_factory=dict)  # shard -> places in its document-offset index
    unknown_urls: int = 0  # replayed documents whose raw record (its URL) the store no longer holds: a URL pattern
    # cannot see them

    def inputs(self, requests_version: str | None) -> dict[str, str]:
        """The training run's manifest inputs besides its own shards: the replayed set (when it is this store's)
        and the removal requests applied to it."""
        return {**({self.input_key: self.data_version} if self.input_key else {}),
                **({REQUESTS: requests_version} if requests_version and self.requests else {})}

    def describe(self) -> dict[str, Any]:
        """For the training run's manifest `stats.replay`: which set, which requests, what they removed."""
        return {"dataset_dir": self.dataset_dir, "data_version": self.data_version, "input": self.input_key,
                "removal_requests": self.requests, "removed_documents": len(self.removed),
                "removed_tokens": sum(r["copies"] * r["tokens"] for r in self.removed),
                "removed_file": REMOVED_FILE if self.removed else None, "unknown_urls": self.unknown_urls}


def read_manifest(dataset_dir: Path) -> Manifest:
    path = Path(dataset_dir) / MANIFEST_NAME
    if not path.is_file():
        raise ReplayError(f"mixture.replay: {dataset_dir} has no {MANIFEST_NAME}: not a complete token_shards "
                          f"dataset; give a token_shards folder (mixture.replay.from)")
    return Manifest.from_dict(json.loads(path.read_text(encoding="utf-8")))


def plan_replay(store: Store, dataset_dir: str | Path, requests: list[RemovalRequest]) -> ReplayPlan:
    """The replayed documents `requests` name, and where their copies sit in the replayed shards."""
    folder = Path(os.path.realpath(dataset_dir))  # a store's link resolved once: one version's files throughout
    manifest = read_manifest(folder)
    own = manifest.asset == SHARDS and folder.resolve() == store.root.joinpath(
        SHARDS, manifest.partition or "_all").resolve()
    plan = ReplayPlan(str(dataset_dir), manifest.data_version, f"{SHARDS}/{manifest.partition}" if own else None,
                      [r.request_id for r in requests])
    plan.removed, plan.exclude, plan.unknown_urls = named_places(store, folder, manifest, requests, TRAIN, dataset_dir,
                                                                 "mixture.replay", "replayed",
                                                                 ", or replay a set written since")
    return plan


def named_places(store: Store, folder: Path, manifest: Manifest, requests: list[RemovalRequest], split: str,
                 shown: str | Path, reader: str, role: str, instead: str = "",
                 ) -> tuple[list[dict[str, Any]], dict[str, list[int]], int]:
    """The documents of one split of a shard set (`folder`, its `manifest`) that `requests` name (REMOVED_SCHEMA
    rows), where their copies sit (shard -> places in its document-offset index, for a reader to skip), and how many
    of the split's documents a URL pattern cannot see (their raw record, with the URL, is gone). ReplayError, naming
    `reader` and what to do, where the set cannot say it (no member or position list, or the two disagree)."""
    if not requests:
        return [], {}, 0
    members = [folder / f.path for f in manifest.files_with_role("members")]
    if not members:
        raise ReplayError(f"{reader}: {shown} has no member list, so the removal requests "
                          f"({', '.join(r.request_id for r in requests)}) cannot be checked against it; re-materialize "
                          f"that token_shards partition (it then leaves them out){instead}")
    rows = [m for p in members for m in pq.read_table(p).to_pylist()
            if m["split"] == split and m["copies"] > 0 and not m.get("removed_by")]
    unseen = {m["doc_id"] for m in rows}
    matchers = with_intake_urls(store, requests, raw_partitions(store, {m["source"] for m in rows}), unseen)
    unknown_urls = len(unseen) if any(r.kind == "url_pattern" for r in requests) else 0
    removed = []
    for m in rows:
        request = first_match(matchers, m["doc_id"], m["source"], None)
        if request is not None:
            removed.append({"doc_id": m["doc_id"], "source": m["source"], "removed_by": request.reject_reason,
                            "copies": m["copies"], "tokens": m["tokens"]})
    if not removed:
        return removed, {}, unknown_urls
    positions = [folder / f.path for f in manifest.files_with_role("positions")]
    if not positions:
        raise ReplayError(f"{reader}: {len(removed)} {role} document(s) of {shown} are named by "
                          f"removal requests, but the set has no position list (written before position lists "
                          f"existed), so they cannot be skipped; re-materialize that token_shards partition (it then "
                          f"leaves them out){instead}")
    wanted = sorted({r["doc_id"] for r in removed})
    exclude: dict[str, list[int]] = {}
    found: dict[str, int] = {}
    for path in positions:
        table = pq.read_table(path, filters=[("doc_id", "in", wanted), ("shard", "in", _shards_of(manifest, split))])
        for shard, index, doc_id in zip(*(table.column(c).to_pylist() for c in ("shard", "index", "doc_id"))):
            exclude.setdefault(shard, []).append(index)
            found[doc_id] = found.get(doc_id, 0) + 1
    missing = [r["doc_id"] for r in removed if found.get(r["doc_id"], 0) != r["copies"]]
    if missing:
        raise ReplayError(f"{reader}: the position list of {shown} disagrees with its member list for "
                          f"{len(missing)} document(s) (e.g. {missing[0]}): the set was altered after it was written; "
                          f"re-materialize that token_shards partition")
    return removed, {s: sorted(ix) for s, ix in sorted(exclude.items())}, unknown_urls


def _shards_of(manifest: Manifest, split: str) -> list[str]:
    return [s["path"] for s in manifest.stats.get("shards", []) if s["split"] == split]


def write_removed(folder: Path, plan: ReplayPlan) -> None:
    """The documents a run left out of its replay, into its dataset folder (nothing when none)."""
    if plan.removed:
        write_parquet_atomic(Path(folder) / REMOVED_FILE, pa.Table.from_pylist(plan.removed, schema=REMOVED_SCHEMA))


def replayed(run: Manifest | None) -> dict[str, Any] | None:
    """What a training run replayed (its `stats.replay`), or None for a run without replay."""
    info = (run.stats.get("replay") if run else None) or None
    return info if info and info.get("data_version") else None


def removed_from_replay(store: Store, run: Manifest) -> dict[str, str] | None:
    """doc_id -> the request, for every document `run` left out of its replay; None when the store no longer
    holds that list (a run a later one replaced, from before the store's history kept it), so it cannot be told."""
    info = replayed(run)
    if info is None or not info.get("removed_file"):
        return {}
    path = run_file(store, run, info["removed_file"])
    if path is None:
        return None
    table = pq.read_table(path, columns=["doc_id", "removed_by"])
    return dict(zip(table.column("doc_id").to_pylist(), table.column("removed_by").to_pylist()))


__all__ = ["REMOVED_FILE", "ReplayError", "ReplayPlan", "named_places", "plan_replay", "removed_from_replay",
           "replayed", "write_removed"]
