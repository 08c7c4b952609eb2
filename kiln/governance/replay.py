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

The split of train and validation documents is a hash of doc_id against `shards.val_fraction`
(kiln.tokens.shard_writer.is_validation). A run whose own shards were written at a higher val_fraction than the
replayed set holds in its validation split documents that were train documents there: the replay leaves those out
too (`hold_out`, the same places mechanism), counted apart from removals (`stats.replay.validation_held_out`; no
row of `replay_removed.parquet`, which lists takedowns). The base checkpoint trained on them all the same:
`trained_validation` says how many of the run's validation documents its training shards held, for the evaluation.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, NamedTuple

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from kiln.common.manifest import MANIFEST_NAME, Manifest
from kiln.common.storage import Store, write_parquet_atomic
from kiln.governance.catalog import member_batches, run_file
from kiln.governance.forget import REQUESTS, RemovalRequest, first_match, raw_partitions, with_intake_urls
from kiln.tokens.shard_format import TRAIN, VAL
from kiln.tokens.shard_writer import is_validation

SHARDS = "token_shards"
REMOVED_FILE = "replay_removed.parquet"
REMOVED_SCHEMA = pa.schema([pa.field("doc_id", pa.string(), nullable=False),
                            pa.field("source", pa.string(), nullable=False),
                            pa.field("removed_by", pa.string(), nullable=False),  # `removal_request:<id>`
                            pa.field("copies", pa.int32(), nullable=False),  # copies the replayed set holds
                            pa.field("tokens", pa.int64(), nullable=False)])  # per copy


class ReplayError(ValueError):
    """Replay data that cannot honour the removal requests (or the run's validation split) as it is; the message
    says what to do."""


class HoldOut(NamedTuple):
    """Documents a reader skips that no removal request names: `test` on a doc_id, `what` they are (for errors)."""

    what: str
    test: Callable[[str], bool]


@dataclass
class Places:
    """What a reader of one split of a shard set leaves out (named_places)."""

    removed: list[dict[str, Any]]  # REMOVED_SCHEMA rows: the documents removal requests name
    held_out: list[dict[str, Any]]  # doc_id, source, copies, tokens: those a HoldOut names and no request does
    exclude: dict[str, list[int]]  # shard -> places of both in its document-offset index, for the reader to skip
    unknown_urls: int  # documents whose raw record (its URL) the store no longer holds: a URL pattern cannot see them


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
    held_out: list[dict[str, Any]] = field(default_factory=list)  # replayed train documents in the run's validation
    # split (doc_id, source, copies, tokens): left out too, but no takedown
    val_fraction: float | None = None  # the run's shards.val_fraction (None: no hold-out asked)
    replayed_val_fraction: float | None = None  # the replayed set's, as its manifest records it

    def inputs(self, requests_version: str | None) -> dict[str, str]:
        """The training run's manifest inputs besides its own shards: the replayed set (when it is this store's)
        and the removal requests applied to it."""
        return {**({self.input_key: self.data_version} if self.input_key else {}),
                **({REQUESTS: requests_version} if requests_version and self.requests else {})}

    def describe(self) -> dict[str, Any]:
        """For the training run's manifest `stats.replay`: which set, which requests, what they removed, and
        what was left out as the run's validation documents."""
        return {"dataset_dir": self.dataset_dir, "data_version": self.data_version, "input": self.input_key,
                "removal_requests": self.requests, "removed_documents": len(self.removed),
                "removed_tokens": sum(r["copies"] * r["tokens"] for r in self.removed),
                "removed_file": REMOVED_FILE if self.removed else None, "unknown_urls": self.unknown_urls,
                "validation_held_out": {"documents": len(self.held_out),
                                        "tokens": sum(r["copies"] * r["tokens"] for r in self.held_out),
                                        "val_fraction": self.val_fraction,
                                        "replayed_val_fraction": self.replayed_val_fraction}}


def read_manifest(dataset_dir: Path) -> Manifest:
    path = Path(dataset_dir) / MANIFEST_NAME
    if not path.is_file():
        raise ReplayError(f"mixture.replay: {dataset_dir} has no {MANIFEST_NAME}: not a complete token_shards "
                          f"dataset; give a token_shards folder (mixture.replay.from)")
    return Manifest.from_dict(json.loads(path.read_text(encoding="utf-8")))


def val_fraction_of(manifest: Manifest) -> float | None:
    """The shards.val_fraction a token_shards version was written with (its manifest config), None if unrecorded."""
    return (manifest.config.get("shards") or {}).get("val_fraction")


def plan_replay(store: Store, dataset_dir: str | Path, requests: list[RemovalRequest],
                val_fraction: float | None = None) -> ReplayPlan:
    """The replayed documents `requests` name, and where their copies sit in the replayed shards. `val_fraction`:
    the run's own shards.val_fraction (its token_shards manifest's); above the replayed set's, the replayed train
    documents now in the run's validation split are left out too (held_out)."""
    folder = Path(os.path.realpath(dataset_dir))  # a store's link resolved once: one version's files throughout
    manifest = read_manifest(folder)
    own = manifest.asset == SHARDS and folder.resolve() == store.root.joinpath(
        SHARDS, manifest.partition or "_all").resolve()
    plan = ReplayPlan(str(dataset_dir), manifest.data_version, f"{SHARDS}/{manifest.partition}" if own else None,
                      [r.request_id for r in requests], val_fraction=val_fraction,
                      replayed_val_fraction=val_fraction_of(manifest))
    hold_out = validation_hold_out(val_fraction, plan.replayed_val_fraction)
    places = named_places(store, folder, manifest, requests, TRAIN, dataset_dir, "mixture.replay", "replayed",
                          ", or replay a set written since", hold_out)
    plan.removed, plan.held_out, plan.exclude, plan.unknown_urls = (places.removed, places.held_out, places.exclude,
                                                                    places.unknown_urls)
    return plan


def validation_hold_out(val_fraction: float | None, replayed_val_fraction: float | None) -> HoldOut | None:
    """The replayed train documents a run whose shards were written at `val_fraction` leaves out as its own
    validation documents: none unless it holds out a larger share than the replayed set did."""
    if not val_fraction or (replayed_val_fraction is not None and replayed_val_fraction >= val_fraction):
        return None
    return HoldOut(f"in this run's validation split (shards.val_fraction {val_fraction}; the replayed set was written "
                   f"at {replayed_val_fraction})", lambda doc_id: is_validation(doc_id, val_fraction))


def named_places(store: Store, folder: Path, manifest: Manifest, requests: list[RemovalRequest], split: str,
                 shown: str | Path, reader: str, role: str, instead: str = "", hold_out: HoldOut | None = None,
                 ) -> Places:
    """The documents of one split of a shard set (`folder`, its `manifest`) that `requests` name (REMOVED_SCHEMA
    rows) and, apart, those `hold_out` names that no request does; where the copies of both sit (shard -> places in
    its document-offset index, for a reader to skip); and how many of the split's documents a URL pattern cannot see
    (their raw record, with the URL, is gone). ReplayError, naming `reader` and what to do, where the set cannot say
    it (no member or position list, or the two disagree)."""
    if not requests and hold_out is None:
        return Places([], [], {}, 0)
    asked = ([f"the removal requests ({', '.join(r.request_id for r in requests)})"] if requests else []) + \
        ([f"the documents {hold_out.what}"] if hold_out else [])
    members = [folder / f.path for f in manifest.files_with_role("members")]
    if not members:
        raise ReplayError(f"{reader}: {shown} has no member list, so {' and '.join(asked)} cannot be checked against "
                          f"it; re-materialize that token_shards partition (it then leaves them out){instead}")
    unknown_urls, matchers = 0, list(requests)
    if any(r.kind == "url_pattern" for r in requests):  # matched against the URLs intake read, by doc_id
        unseen, sources = set(), set()
        for batch in member_batches(members, (split,), ["doc_id", "source"]):
            unseen.update(batch.column("doc_id").to_pylist())
            sources.update(pc.unique(batch.column("source")).to_pylist())
        matchers = with_intake_urls(store, requests, raw_partitions(store, sources), unseen)
        unknown_urls = len(unseen)
        del unseen
    removed, held_out = [], []
    for batch in member_batches(members, (split,), ["doc_id", "source", "copies", "tokens"]):
        for doc_id, source, copies, tokens in zip(*(c.to_pylist() for c in batch.columns)):
            request = first_match(matchers, doc_id, source, None)
            if request is not None:
                removed.append({"doc_id": doc_id, "source": source, "removed_by": request.reject_reason,
                                "copies": copies, "tokens": tokens})
            elif hold_out is not None and hold_out.test(doc_id):
                held_out.append({"doc_id": doc_id, "source": source, "copies": copies, "tokens": tokens})
    if not removed and not held_out:
        return Places(removed, held_out, {}, unknown_urls)
    positions = [folder / f.path for f in manifest.files_with_role("positions")]
    if not positions:
        named = ([f"{len(removed)} named by removal requests"] if removed else []) + \
            ([f"{len(held_out)} {hold_out.what}"] if held_out else [])
        raise ReplayError(f"{reader}: {len(removed) + len(held_out)} {role} document(s) of {shown} must be skipped "
                          f"({'; '.join(named)}), but the set has no position list (written before position lists "
                          f"existed), so they cannot be skipped; re-materialize that token_shards partition (it then "
                          f"leaves them out){instead}")
    wanted = sorted({r["doc_id"] for r in removed + held_out})
    exclude: dict[str, list[int]] = {}
    found: dict[str, int] = {}
    for path in positions:
        table = pq.read_table(path, filters=[("doc_id", "in", wanted), ("shard", "in", _shards_of(manifest, split))])
        for shard, index, doc_id in zip(*(table.column(c).to_pylist() for c in ("shard", "index", "doc_id"))):
            exclude.setdefault(shard, []).append(index)
            found[doc_id] = found.get(doc_id, 0) + 1
    missing = [r["doc_id"] for r in removed + held_out if found.get(r["doc_id"], 0) != r["copies"]]
    if missing:
        raise ReplayError(f"{reader}: the position list of {shown} disagrees with its member list for "
                          f"{len(missing)} document(s) (e.g. {missing[0]}): the set was altered after it was written; "
                          f"re-materialize that token_shards partition")
    return Places(removed, held_out, {s: sorted(ix) for s, ix in sorted(exclude.items())}, unknown_urls)


def _shards_of(manifest: Manifest, split: str) -> list[str]:
    return [s["path"] for s in manifest.stats.get("shards", []) if s["split"] == split]


def trained_validation(trained_on: str | Path | None, shards_dir: str | Path, shards: Manifest,
                       ) -> dict[str, Any] | None:
    """How many of a run's validation documents (the validation split of its shards: `shards_dir`, `shards`) its base
    checkpoint trained on: the train split of the base's training shards (`trained_on`, as the base records them),
    from the two member lists, when those were written at a lower shards.val_fraction (else none can be).
    None where it is not lower or cannot be told (no such folder); `documents` None without member lists."""
    val_fraction = val_fraction_of(shards)
    if not trained_on or val_fraction is None:
        return None
    folder = Path(os.path.realpath(trained_on))
    try:
        base = read_manifest(folder)
    except (ReplayError, OSError, ValueError, TypeError):  # gone, or no Kiln manifest: cannot be told
        return None
    base_fraction = val_fraction_of(base)
    if base_fraction is None or base_fraction >= val_fraction:
        return None
    out: dict[str, Any] = {"documents": None, "val_fraction": val_fraction, "base_val_fraction": base_fraction,
                           "trained_on": str(trained_on)}
    run_members = [Path(shards_dir) / f.path for f in shards.files_with_role("members")]
    base_members = [folder / f.path for f in base.files_with_role("members")]
    if run_members and base_members:
        validation = {d for p in run_members for d in pq.read_table(
            p, columns=["doc_id"], filters=[("split", "==", VAL), ("copies", ">", 0)]).column("doc_id").to_pylist()}
        out["documents"] = len(validation & {d for p in base_members for d in pq.read_table(
            p, columns=["doc_id"], filters=[("split", "==", TRAIN), ("copies", ">", 0)]).column("doc_id").to_pylist()})
    return out


def write_removed(folder: Path, plan: ReplayPlan) -> None:
    """The documents a run left out of its replay, into its dataset folder (nothing when none)."""
    if plan.removed:
        write_parquet_atomic(Path(folder) / REMOVED_FILE, pa.Table.from_pylist(plan.removed, schema=REMOVED_SCHEMA))


def replayed(run: Manifest | None) -> dict[str, Any] | None:
    """What a training run replayed (its `stats.replay`), or None for a run without replay."""
    info = (run.stats.get("replay") if run else None) or None
    return info if info and info.get("data_version") else None


def held_out_of_replay(run: Manifest | None) -> HoldOut | None:
    """The replayed train documents `run` left out as its own validation documents (from what it recorded)."""
    held = (replayed(run) or {}).get("validation_held_out") or {}
    return validation_hold_out(held.get("val_fraction"), held.get("replayed_val_fraction"))


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


__all__ = ["REMOVED_FILE", "HoldOut", "Places", "ReplayError", "ReplayPlan", "held_out_of_replay", "named_places",
           "plan_replay", "removed_from_replay", "replayed", "trained_validation", "val_fraction_of",
           "validation_hold_out", "write_removed"]
