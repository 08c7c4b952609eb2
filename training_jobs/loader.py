"""The training data loader: fixed-length sequences from memory-mapped token shards, split across ranks,
resumable to the exact next sequence.

Reading order. Each curriculum phase's shards form one token stream (documents are already shuffled and
EOS-separated by the writer). Sequence g of a phase is tokens[g*seq_len : g*seq_len + seq_len + 1]
(inputs = the first seq_len, targets = the last seq_len; neighbours share one boundary token).
Phases are read in order; the stream never runs from one phase into the next.

Ranks. Sequence j*world_size + r of a phase goes to rank r as its j-th; each phase drops its last
(count % world_size) sequences, so every rank gets the same number and no token is read twice. A phase with fewer
sequences than ranks is refused, naming it (no rank would ever read it).

Epochs. Epoch 0 reads sequences in file order. With `shuffle_epochs` (default) epoch e >= 1 reads each
phase's sequences in a pseudo-random permutation keyed by (seed, e, phase), computed slot by slot (`shuffled`, a
Feistel network: nothing per sequence is held): the same on every rank, so the split stays disjoint. Runs
checkpointed with a state of the first format ("kiln-loader/1") drew a stored permutation instead, and resume in it.
`next_batch()` rolls into the next epoch by itself; iterating yields the rest of the current epoch.

Exclusions. `exclude` names documents (by shard and place in its document-offset index) the loader must never
read: every sequence that would hold one of their tokens is dropped from its phase stream before ranks and epochs
are laid out, so the rest reads as above; a phase they leave fewer sequences than ranks is refused, naming it, as a
phase that short is. Continued pretraining passes the replayed documents a removal request names since the shards
were written (kiln.governance.replay).

Exposure. `exposure()` says, from the loader's cursor alone, how often every document of its shards was read over all
ranks up to there (the run records its final cursor in summary.json; kiln.governance.exposure turns the counts into
doc_ids): a document is read in an epoch when a sequence read in that epoch holds one of its tokens (inputs or the
last target, as for exclusions); its tokens read are those that were inputs, so they sum to sequences read x seq_len.

Resuming. `state_dict()` is a small JSON-able dict (epoch and sequences consumed); it is the same on
every rank, so rank 0's copy in the checkpoint's client_state restores all ranks. Resuming with another
seq_len, world size, seed, dataset or tokenizer is refused; another batch size is fine.

Prefetching. `Prefetcher` reads either loader a couple of batches ahead on a background thread (into pinned memory
on CUDA, so the copy to the device can be asynchronous); it hands out the same batches in the same order, and its
`state_dict()` is the position of the batches handed out, not of those read ahead.

Imports: numpy, torch, the standard library, kiln.tokens.shard_format and kiln.common.splitmix only (both numpy
only: training may run where Kiln's processing stack is not installed).
"""

from __future__ import annotations

import os
import queue
import threading
import weakref
from collections.abc import Iterator
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
import torch

from kiln.common.splitmix import finalize, finalize_int
from kiln.tokens.shard_format import (DTYPES, ShardError, ShardInfo, check_listed, check_shard, hold_folder,
                                      open_shard, read_shard_set, shard_tokens, token_dtype)

STATE_FORMAT = "kiln-loader/2"
# Loader states and the order of their shuffled epochs: /1 drew a stored permutation (8 B per sequence of the phase,
# held by every rank); its runs resume in that order. /2 computes each slot's sequence (`shuffled`).
_EPOCH_ORDERS = {"kiln-loader/1": "stored", STATE_FORMAT: "computed"}


@dataclass(frozen=True)
class _Phase:
    name: str
    names: tuple[str, ...]  # each shard's path in the manifest, relative to the dataset folder (no Path per shard)
    starts: np.ndarray  # int64, token offset of each shard within the phase stream, plus the total
    sequences: int  # sequences in the phase stream, before the per-rank cut
    per_rank: int  # sequences each rank reads from this phase
    kept: KeptSequences | None = None  # with exclusions: which of the stream's sequences may be read

    @property
    def tokens(self) -> int:
        return int(self.starts[-1])


class KeptSequences:
    """The sequences 0 .. total - 1 of a phase stream less the excluded ranges [lo, hi), numbered in order: held as the
    merged ranges (memory grows with the exclusions, not with the stream; a list of the kept ones would be 8 B per
    sequence on every rank)."""

    def __init__(self, total: int, lo: np.ndarray, hi: np.ndarray):
        lo, hi = np.asarray(lo, np.int64), np.asarray(hi, np.int64)
        nonempty = hi > lo
        order = np.argsort(lo[nonempty], kind="stable")
        lo, hi = lo[nonempty][order], hi[nonempty][order]
        # Merge overlapping or touching ranges: a range starts a new one when it begins past every earlier end.
        first = np.ones(len(lo), bool)
        first[1:] = lo[1:] > np.maximum.accumulate(hi)[:-1]
        starts_at = np.flatnonzero(first)
        self.lo = lo[starts_at]
        self.hi = np.maximum.reduceat(hi, starts_at) if len(lo) else hi  # reduceat refuses no indices
        self._skipped = np.concatenate([[0], np.cumsum(self.hi - self.lo)])  # excluded before each range, and in all
        self._kept_before = self.lo - self._skipped[:-1]  # kept sequences before each range
        self.total = int(total)

    def __len__(self) -> int:
        return self.total - int(self._skipped[-1])

    def sequence(self, kept_index):
        """The stream's sequence number of the kept_index-th kept sequence (an int or an int64 array): past every
        range that starts at or before it among the kept ones, it is shifted by those ranges' lengths."""
        passed = np.searchsorted(self._kept_before, kept_index, side="right")
        return kept_index + self._skipped[passed]


class DatasetReplaced(ShardError):
    """The shard set is no longer the version the run was set up on."""


class ShardLoader:
    """Batches of (inputs, targets), LongTensors of shape (batch_size, seq_len), from a token_shards dataset."""

    def __init__(self, dataset_dir: str | Path, split: str = "train", seq_len: int | None = None,
                 batch_size: int = 8, rank: int = 0, world_size: int = 1,
                 expected_tokenizer_sha256: str | None = None, seed: int = 0, shuffle_epochs: bool = True,
                 drop_last: bool = True, phases: list[str] | None = None,
                 exclude: dict[str, list[int]] | None = None, expected_data_version: str | None = None):
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} is outside world_size {world_size}")
        self.shard_set = read_shard_set(Path(dataset_dir))
        # The version read stays on disk while this loader lives, whatever is materialized meanwhile.
        weakref.finalize(self, os.close, hold_folder(self.shard_set.dir))
        version = self.shard_set.data_version
        if expected_data_version is not None and version != expected_data_version:
            raise DatasetReplaced(f"{dataset_dir} is now version {version}, this run was set up on version "
                                  f"{expected_data_version} (its lineage, removal requests and replay exclusions "
                                  f"were checked against that one): the shards were materialized again meanwhile. "
                                  f"Start the run again (in Dagster: materialize training_run) to train on the new "
                                  f"version")
        sha = self.shard_set.tokenizer_sha256
        if expected_tokenizer_sha256 is not None and sha != expected_tokenizer_sha256.lower():
            raise ShardError(f"{dataset_dir} was written with tokenizer {sha[:12]}…, the loader expects "
                             f"{expected_tokenizer_sha256[:12]}…; re-materialize token_shards with this "
                             f"tokenizer, or train with the tokenizer these shards were made with")
        self.split, self.rank, self.world_size = split, rank, world_size
        self.seq_len = int(seq_len or self.shard_set.stats.get("seq_len") or 0)
        if self.seq_len < 1 or batch_size < 1:
            raise ValueError(f"seq_len ({self.seq_len}) and batch_size ({batch_size}) must be positive")
        self.batch_size, self.seed, self.shuffle_epochs, self.drop_last = batch_size, seed, shuffle_epochs, drop_last
        self.tokenizer_sha256 = sha
        self._dtype = token_dtype(self.shard_set.vocab_size)
        # What the exclusions cost: documents and their tokens left out, and the sequences skipped for them.
        self.excluded = {"documents": 0, "tokens": 0, "sequences": 0}
        self.phases = self._open_phases(split, expected_tokenizer_sha256 or sha, phases, exclude or {})
        # Shards are mapped on demand, each checked again as it is: a bounded number of open maps (each holds a
        # file descriptor), however many shards the dataset has.
        self._tokens = _shard_maps(self.shard_set.dir, expected_tokenizer_sha256 or sha, self._dtype)
        self._phase_ends = np.cumsum([p.per_rank for p in self.phases])
        self.sequences_per_epoch = int(self._phase_ends[-1]) if self.phases else 0
        if self.sequences_per_epoch < (batch_size if drop_last else 1):
            raise ShardError(f"{dataset_dir} [{split}] has {sum(p.tokens for p in self.phases):,} tokens: "
                             f"{self.sequences_per_epoch} sequences of {self.seq_len} per rank for "
                             f"{world_size} rank(s), fewer than one batch of {batch_size}; lower seq_len or "
                             f"batch_size, or write more tokens")
        self.epoch, self.position = 0, 0  # position: sequences this rank has consumed in this epoch
        self._epoch_order = _EPOCH_ORDERS[STATE_FORMAT]  # a resumed /1 state sets "stored"
        self._permutations: dict[tuple[int, int], np.ndarray] = {}  # the stored order's, one phase at a time

    def _open_phases(self, split: str, sha: str, wanted: list[str] | None,
                     exclude: dict[str, list[int]]) -> list[_Phase]:
        """Check this rank's share of the shards (header, size, tokenizer, counts against the manifest) and group them
        all by phase; `wanted`: only these phases (by name, in the shard set's order); `exclude`: documents never
        read. Rank r checks shards r, r + world_size, ... of the split (and every shard with exclusions, whose
        index it reads): together the ranks check every shard once, and training refuses on every rank what one
        rank refused (training_jobs.setup.refuse_together). A shard another rank checked is checked here too when
        this rank first maps it (`_shard_maps`)."""
        infos = self.shard_set.split(split)
        unknown = sorted(set(exclude) - {i.path for i in self.shard_set.shards})
        if unknown:
            raise ShardError(f"the excluded documents name shard(s) {unknown[:3]} that {self.shard_set.dir} does not "
                             f"hold: the exclusions were computed for another shard set; compute them again")
        if wanted is not None:
            present = sorted({i.phase for i in infos})
            missing = sorted(set(wanted) - set(present))
            if missing:
                raise ShardError(f"{self.shard_set.dir} [{split}] has no phase {missing} (phases: {present}); fix "
                                 f"training.phases or add the phase to mixture.phases and re-materialize token_shards")
            infos = [i for i in infos if i.phase in wanted]
        phases: dict[int, tuple[str, list[str], list[int]]] = {}
        spans: dict[int, list[np.ndarray]] = {}  # phase -> [(start, end)] of excluded documents, within the phase
        for k, info in enumerate(infos):
            # A header and a stat per shard, by one rank: every rank checking every shard opened 250,000 files per
            # rank at 10^12 tokens in the default shards; reading each document index too (8 B a document) made
            # every rank read 8 GB at 10^9 documents.
            excluded = exclude.get(info.path)
            if k % self.world_size == self.rank or excluded:
                path = self.shard_set.dir / info.path
                _check_against(path, info, sha, self._dtype)
            name, names, sizes = phases.setdefault(info.phase_index, (info.phase, [], []))
            if excluded:
                index = np.unique(np.asarray(excluded, np.int64))
                if index[0] < 0 or index[-1] >= info.documents:
                    raise ShardError(f"the excluded documents of {path} include index {int(index[-1])}, but "
                                     f"the shard holds {info.documents} documents: the exclusions were computed "
                                     f"for another shard set; compute them again")
                offsets = open_shard(path, sha).offsets.astype(np.int64) + sum(sizes)
                spans.setdefault(info.phase_index, []).append(np.stack([offsets[index], offsets[index + 1]], 1))
                self.excluded["documents"] += len(index)
                self.excluded["tokens"] += int((offsets[index + 1] - offsets[index]).sum())
            names.append(info.path)
            sizes.append(info.tokens)
        result = []
        for index, (name, names, sizes) in sorted(phases.items()):
            starts = np.zeros(len(names) + 1, np.int64)
            np.cumsum(sizes, out=starts[1:])
            sequences = max(int(starts[-1]) - 1, 0) // self.seq_len
            if sequences < self.world_size:  # no rank would read it: a configured phase silently never trained on
                raise ShardError(
                    f"{self.shard_set.dir} [{split}] phase {name!r} has {int(starts[-1]):,} tokens: {sequences} "
                    f"sequence{'s' * (sequences != 1)} of {self.seq_len}, fewer than one for each of "
                    f"{self.world_size} ranks, so it would never be trained on; give it more tokens "
                    f"(mixture.phases[].tokens, then materialize token_shards), lower training.seq_len, or leave "
                    f"it out with training.phases")
            kept = None
            if index in spans:
                kept = self._kept_sequences(np.concatenate(spans[index]), sequences)
                if len(kept) < self.world_size:  # as above: the exclusions would leave no rank a sequence of it
                    fewer = f"launch at most {len(kept)} ranks, " if len(kept) else ""
                    raise ShardError(
                        f"{self.shard_set.dir} [{split}] phase {name!r}: the excluded documents (removal requests) "
                        f"leave {len(kept)} of its {sequences} sequences of {self.seq_len}, fewer than one for each of "
                        f"{self.world_size} ranks, so what is left of it would never be trained on; {fewer}lower "
                        f"training.seq_len, or train without these shards (for replayed ones: mixture.replay unset)")
                self.excluded["sequences"] += sequences - len(kept)
                sequences = len(kept)
            result.append(_Phase(name, tuple(names), starts, sequences, sequences // self.world_size, kept))
        return result

    def _kept_sequences(self, spans: np.ndarray, sequences: int) -> KeptSequences:
        """The sequences of a phase stream that hold no token of the [start, end) spans: sequence g reads
        tokens [g·L, g·L + L] (its last target included), so it touches [a, b) when g·L < b and g·L + L + 1 > a."""
        L = self.seq_len
        lo = np.clip((spans[:, 0] - L - 1) // L + 1, 0, sequences)
        hi = np.clip((spans[:, 1] - 1) // L + 1, 0, sequences)
        return KeptSequences(sequences, lo, hi)

    # -- reading

    @property
    def batches_per_epoch(self) -> int:
        full, rest = divmod(self.sequences_per_epoch, self.batch_size)
        return full + (0 if self.drop_last or not rest else 1)

    def __len__(self) -> int:
        return self.batches_per_epoch

    def _epoch_end(self) -> int:
        """Sequences this rank reads per epoch, cut to whole batches when drop_last."""
        n = self.sequences_per_epoch
        return n - n % self.batch_size if self.drop_last else n

    def _global_index(self, epoch: int, phase_index: int, j: int) -> int:
        """Which sequence of the phase stream is this rank's j-th in that phase."""
        return int(self._stream_sequences(epoch, phase_index, j * self.world_size + self.rank))

    def _stream_sequences(self, epoch: int, phase_index: int, slots):
        """The phase stream's sequence numbers at these slots of an epoch (an int or an array; slot j·world_size + r
        is rank r's j-th): the one place the reading order is laid out, for reading and for `exposure`."""
        phase = self.phases[phase_index]
        if epoch != 0 and self.shuffle_epochs and self._epoch_order == "computed":
            slots = shuffled(slots, phase.sequences, (self.seed, epoch, phase_index))
        elif epoch != 0 and self.shuffle_epochs:
            key = (epoch, phase_index)
            if key not in self._permutations:
                self._permutations = {key: np.random.default_rng([self.seed, epoch, phase_index])
                                      .permutation(phase.sequences)}
            slots = self._permutations[key][slots]
        return slots if phase.kept is None else phase.kept.sequence(slots)

    def _read(self, phase: _Phase, start: int, count: int) -> np.ndarray:
        out = np.empty(count, dtype=self._dtype)
        s, filled = int(np.searchsorted(phase.starts, start, side="right")) - 1, 0
        while filled < count:
            local = start + filled - int(phase.starts[s])
            take = min(count - filled, int(phase.starts[s + 1] - phase.starts[s]) - local)
            if take > 0:
                tokens = self._tokens(phase.names[s], int(phase.starts[s + 1] - phase.starts[s]))
                out[filled:filled + take] = tokens[local:local + take]
                filled += take
            s += 1
        return out

    def sequence(self, epoch: int, k: int) -> np.ndarray:
        """This rank's k-th sequence of an epoch: seq_len + 1 tokens."""
        p = int(np.searchsorted(self._phase_ends, k, side="right"))
        j = k - (int(self._phase_ends[p - 1]) if p else 0)
        g = self._global_index(epoch, p, j)
        return self._read(self.phases[p], g * self.seq_len, self.seq_len + 1)

    def _batch(self, count: int) -> tuple[torch.Tensor, torch.Tensor]:
        rows = np.stack([self.sequence(self.epoch, self.position + i) for i in range(count)]).astype(np.int64)
        self.position += count
        data = torch.from_numpy(rows)
        return data[:, :-1], data[:, 1:]

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """The rest of the current epoch; afterwards the loader stands at the start of the next one."""
        end = self._epoch_end()
        if self.position >= end:
            self.epoch, self.position = self.epoch + 1, 0
        while self.position < end:
            yield self._batch(min(self.batch_size, end - self.position))
        self.epoch, self.position = self.epoch + 1, 0

    def next_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        """One batch, rolling into the next epoch when this one is done (for step-counted training loops)."""
        end = self._epoch_end()
        if self.position >= end:
            self.epoch, self.position = self.epoch + 1, 0
        return self._batch(min(self.batch_size, end - self.position))

    def phase_at(self, state: dict[str, Any]) -> str:
        """The curriculum phase of the last sequence read by the time the loader stood at `state` (its state_dict):
        the stability monitor judges a step's loss against steps of the same phase."""
        k = min(max(int(state["position"]) - 1, 0), self.sequences_per_epoch - 1)
        return self.phases[int(np.searchsorted(self._phase_ends, k, side="right"))].name

    # -- resuming

    def state_dict(self) -> dict[str, Any]:
        formats = {order: name for name, order in _EPOCH_ORDERS.items()}
        return {"format": formats[self._epoch_order], "split": self.split, "epoch": self.epoch,
                "position": self.position, "seq_len": self.seq_len, "world_size": self.world_size, "seed": self.seed,
                "shuffle_epochs": self.shuffle_epochs, "tokenizer_sha256": self.tokenizer_sha256,
                "sequences_per_epoch": self.sequences_per_epoch, "excluded_sequences": self.excluded["sequences"],
                "data_version": self.shard_set.data_version}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("format") not in _EPOCH_ORDERS:
            raise ShardError(f"not a loader state (format {state.get('format')!r}, expected {STATE_FORMAT!r})")
        if state.get("excluded_sequences", 0) != self.excluded["sequences"]:
            raise ShardError(f"cannot resume: the checkpoint's loader skipped {state.get('excluded_sequences', 0)} "
                             f"sequences for excluded documents, this one skips {self.excluded['sequences']}; resume "
                             f"with the same exclusions (a new removal request starts a new continued run)")
        # A position in one version of the shards is no position in another (a takedown, new data): refused even
        # where the counts agree. States written before versions were recorded (or outside a store) hold None.
        recorded, current = state.get("data_version"), self.shard_set.data_version
        if recorded is not None and current is not None and recorded != current:
            raise DatasetReplaced(f"cannot resume: the checkpoint's loader read version {recorded} of the "
                                  f"{self.split} shards, they are now version {current} (materialized again "
                                  f"since), where its position means nothing. Start a new run (another output_dir), "
                                  f"or continue this one on the new version with training.base_checkpoint set to "
                                  f"the checkpoint")
        for key in ("split", "seq_len", "world_size", "seed", "shuffle_epochs", "tokenizer_sha256",
                    "sequences_per_epoch"):
            if state[key] != getattr(self, key):
                raise ShardError(f"cannot resume: the checkpoint's loader had {key} = {state[key]!r}, this one has "
                                 f"{getattr(self, key)!r}; resume with the same data and settings (a different "
                                 f"world size needs a position conversion: sequences consumed = position x "
                                 f"world_size)")
        self.epoch, self.position = int(state["epoch"]), int(state["position"])
        self._epoch_order = _EPOCH_ORDERS[state["format"]]

    def long_document_share(self, length: int) -> float:
        """The share of this split's tokens that sit in documents of at least `length` tokens: how much of a
        long-context phase's data can fill its window with one document (the rest is packed shorter ones)."""
        long = total = 0
        for phase in self.phases:
            for name in phase.names:
                sizes = np.diff(open_shard(self.shard_set.dir / name, self.tokenizer_sha256).offsets.astype(np.int64))
                long += int(sizes[sizes >= length].sum())
                total += int(sizes.sum())
        return long / total if total else 0.0

    def roles(self) -> dict[str, "ShardLoader"]:
        """The shard sets this loader reads, by role (a ReplayLoader adds "replay")."""
        return {"train": self}

    def exposure(self) -> Iterator[tuple[str, np.ndarray, np.ndarray]]:
        """How often each document of the shards was read, over all ranks, from the first sequence up to this loader's
        cursor (load a recorded `state_dict()` first), a shard at a time in the order the phases list them: (shard (its
        path in the manifest), reads, tokens), one entry per document of its offset index. reads: the epochs in which a
        read sequence held one of its tokens (inputs or the last target, as exclusions count them); tokens: its tokens
        that were inputs, summed over epochs. Every rank stands at the same cursor, so one loader answers for all
        ranks. Held beside one shard's counts: a bit per sequence of its phase per epoch read (`_ReadBits`)."""
        L, W = self.seq_len, self.world_size
        # Sequences each rank read per epoch: whole epochs before the cursor's, then its position.
        read = [self._epoch_end()] * self.epoch + [min(self.position, self._epoch_end())]
        phase_starts = np.concatenate([[0], self._phase_ends[:-1]]).astype(np.int64)
        for p, phase in enumerate(self.phases):
            total = max(phase.tokens - 1, 0) // L  # the phase stream's sequences, excluded ones included
            epochs = []
            for epoch, n in enumerate(read):
                if slots := W * int(np.clip(n - phase_starts[p], 0, phase.per_rank)):
                    chunks = (np.arange(k, min(k + _SLOTS, slots)) for k in range(0, slots, _SLOTS))
                    epochs.append(_ReadBits.of(total, (self._stream_sequences(epoch, p, c) for c in chunks)))
            for s, name in enumerate(phase.names):
                path = self.shard_set.dir / name
                shard = open_shard(path, self.tokenizer_sha256)  # this rank may not have checked it when it opened
                _as_listed(path, shard.tokens, int(phase.starts[s + 1] - phase.starts[s]), self._dtype)
                offsets = shard.offsets.astype(np.int64) + phase.starts[s]
                a, b = offsets[:-1], offsets[1:]  # document spans [a, b) in the phase stream
                reads, tokens = np.zeros(len(a), np.int32), np.zeros(len(a), np.int64)
                # sequence g touches [a, b) when g·L < b and g·L + L + 1 > a
                lo, hi = np.clip((a - L - 1) // L + 1, 0, total), np.clip((b - 1) // L + 1, 0, total)
                ka, kb = np.minimum(a // L, total), np.minimum(b // L, total)
                first = int(min(lo.min(), ka.min())) if len(a) else 0
                last = int(max(hi.max(), kb.max())) if len(a) else 0
                for bits in epochs:
                    before, hit = bits.window(first, last)  # sequences read among the first g; g read, from `first`
                    reads += (before[hi - first] > before[lo - first]).astype(np.int32)
                    # input tokens t < x: L per read sequence wholly below x, plus x mod L of sequence x // L if read
                    tokens += (L * (before[kb - first] - before[ka - first]) + hit[kb - first] * (b % L)
                               - hit[ka - first] * (a % L))
                yield name, reads, tokens

    @property
    def tokens_per_epoch(self) -> int:
        """Input tokens this rank reads per epoch."""
        return self._epoch_end() * self.seq_len


_SLOTS = 1 << 18  # reading slots whose sequences `exposure` looks up at once (~80 B each while it does)
_ROUNDS = 6  # Feistel rounds: 4 make a pseudo-random permutation (Luby-Rackoff), 2 more for margin


def _check_against(path: Path, info: ShardInfo, sha: str, dtype: np.dtype) -> None:
    """The shard's header, size and tokenizer (check_shard), and its counts and token width against the manifest."""
    width, tokens, documents, _ = check_shard(path, expected_tokenizer_sha256=sha)
    check_listed(path, info, tokens, documents)
    if DTYPES[width] != dtype:
        raise ShardError(f"{path} holds tokens of {width} B, its shard set's vocabulary {dtype.itemsize} B ones: the "
                         f"dataset was altered after it was written; re-materialize token_shards")


def _shard_maps(folder: Path, sha: str, dtype: np.dtype):
    """(name, tokens the manifest lists) -> the tokens of shard `folder / name`, memory-mapped after its header, size,
    tokenizer, count and width are checked, the last 64 kept open. A plain function, not a method: no cycle keeps the
    maps open after the loader."""
    @lru_cache(maxsize=64)
    def tokens(name: str, listed: int) -> np.ndarray:
        path = folder / name
        return _as_listed(path, shard_tokens(path, sha), listed, dtype)

    return tokens


def _as_listed(path: Path, tokens: np.ndarray, listed: int, dtype: np.dtype) -> np.ndarray:
    """A shard's tokens, refused unless as many and as wide as the manifest lists (the phase's stream offsets)."""
    if len(tokens) != listed or tokens.dtype != dtype:
        raise ShardError(f"{path} holds {len(tokens)} tokens of {tokens.dtype.itemsize} B but the manifest lists "
                         f"{listed} of {dtype.itemsize} B: the dataset was altered after it was written; "
                         f"re-materialize token_shards")
    return tokens


def shuffled(slots, n: int, key: tuple[int, ...]):
    """Slot i of a shuffled epoch -> the sequence it reads, a permutation of range(n) drawn from `key`, computed per
    slot (an int or an array): a Feistel network on the smallest even number of bits covering n, walked again while
    the result is n or more (cycle walking keeps it a permutation of range(n)). Nothing per sequence is held, where a
    stored permutation costs every rank 8 B per sequence of the phase (3.9 GB at 10^12 tokens of 2,048)."""
    bits = max(2, (n - 1).bit_length())
    half = (bits + 1) // 2
    low = np.uint64((1 << half) - 1)
    round_keys = _round_keys(tuple(key))
    if np.ndim(slots) == 0:  # a sequence at a time, as a batch is read: Python ints (numpy's per-call cost is ~10x)
        x, mask = int(slots), int(low)
        if not 0 <= x < n:
            raise IndexError(f"slot {x} of an epoch of {n} sequences")
        while True:
            left, right = x >> half, x & mask
            for k in round_keys:
                left, right = right, left ^ (finalize_int(right ^ k) & mask)
            x = (left << half) | right
            if x < n:
                return x
    out = np.asarray(slots, np.uint64).copy()
    if out.size and (out.max() >= n):
        raise IndexError(f"slot {int(out.max())} of an epoch of {n} sequences")
    todo = np.arange(out.size)
    with np.errstate(over="ignore"):
        while todo.size:
            left, right = out[todo] >> np.uint64(half), out[todo] & low
            for k in round_keys:
                left, right = right, left ^ (finalize(right ^ np.uint64(k)) & low)
            out[todo] = (left << np.uint64(half)) | right
            todo = todo[out[todo] >= n]
    return out.astype(np.int64)


@lru_cache(maxsize=64)
def _round_keys(key: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(int(k) for k in np.random.SeedSequence([*key, 0x4B494C4E]).generate_state(_ROUNDS, np.uint64))


class _ReadBits:
    """Which sequences of a phase stream one epoch read, as a bit each, and how many were read before each: what
    `exposure` keeps per epoch while it counts a shard at a time (8 B per sequence as int64 prefix sums; ~1 bit so)."""

    BLOCK = 1 << 16  # sequences per stored prefix sum

    def __init__(self, packed: np.ndarray, prefix: np.ndarray):
        self.packed, self.prefix = packed, prefix

    @classmethod
    def of(cls, total: int, read: Iterator[np.ndarray]) -> _ReadBits:
        """Of the sequence numbers `read` (arrays) among a stream of `total`, plus a never-read end (number total)."""
        hit = np.zeros(total + 1, bool)
        for sequences in read:
            hit[sequences] = True
        whole = (total + 1) // cls.BLOCK * cls.BLOCK  # summed as blocks of a view: reduceat cast a copy, 8 B each
        sums = [hit[:whole].reshape(-1, cls.BLOCK).sum(axis=1, dtype=np.int64), [hit[whole:].sum()]]
        return cls(np.packbits(hit), np.concatenate([[0], np.cumsum(np.concatenate(sums))]))

    def window(self, first: int, last: int) -> tuple[np.ndarray, np.ndarray]:
        """(before, hit) for sequences first..last: before[g - first] sequences read among the first g, hit[g - first]
        1 if g was read."""
        start = first - first % self.BLOCK
        bits = np.unpackbits(self.packed[start // 8:last // 8 + 1])[:last + 1 - start]
        before = self.prefix[start // self.BLOCK] + np.concatenate([[0], np.cumsum(bits[:-1], dtype=np.int64)])
        return before[first - start:], bits[first - start:].astype(np.int64)


REPLAY_STATE_FORMAT = "kiln-replay-loader/1"


class ReplayLoader:
    """Batches in which a fixed share of the sequences comes from another shard set (continued pretraining's
    replay of the base run's data). Sequence k of this rank's stream is a replay sequence when
    floor((k + 1)·share) > floor(k·share): exactly `share` of every long enough stretch, spread evenly, and the
    same on resume (the state is the count and both loaders' positions). Both loaders read one sequence at a
    time, each in its own order, rolling into their own next epochs."""

    def __init__(self, main: ShardLoader, replay: ShardLoader, share: float, batch_size: int):
        if not 0 < share < 1:
            raise ValueError(f"replay share {share} must be between 0 and 1")
        if replay.seq_len != main.seq_len or replay.tokenizer_sha256 != main.tokenizer_sha256:
            raise ShardError(f"replay shards {replay.shard_set.dir} have seq_len {replay.seq_len} / tokenizer "
                             f"{replay.tokenizer_sha256[:12]}…, the training shards {main.seq_len} / "
                             f"{main.tokenizer_sha256[:12]}…: replay needs the same tokenizer")
        self.main, self.replay, self.share, self.batch_size = main, replay, share, batch_size
        self.seq_len, self.shard_set, self.count = main.seq_len, main.shard_set, 0

    def is_replay(self, k: int) -> bool:
        return int((k + 1) * self.share) > int(k * self.share)

    def next_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        rows = []
        for _ in range(self.batch_size):
            rows.append((self.replay if self.is_replay(self.count) else self.main).next_batch())
            self.count += 1
        return torch.cat([x for x, _ in rows]), torch.cat([y for _, y in rows])

    def state_dict(self) -> dict[str, Any]:
        return {"format": REPLAY_STATE_FORMAT, "share": self.share, "count": self.count,
                "main": self.main.state_dict(), "replay": self.replay.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("format") != REPLAY_STATE_FORMAT or state["share"] != self.share:
            raise ShardError(f"cannot resume: the checkpoint's loader state is {state.get('format')!r} with share "
                             f"{state.get('share')}, this run replays {self.share}; resume with the same "
                             f"mixture.replay")
        self.main.load_state_dict(state["main"])
        self.replay.load_state_dict(state["replay"])
        self.count = int(state["count"])

    def long_document_share(self, length: int) -> float:
        return self.main.long_document_share(length)

    def phase_at(self, state: dict[str, Any]) -> str:
        return self.main.phase_at(state["main"])

    def roles(self) -> dict[str, ShardLoader]:
        return {"train": self.main, "replay": self.replay}


class Prefetcher:
    """`source.next_batch()` run `depth` batches ahead on a daemon thread, so the training step never waits for the
    shards to be read and stacked. On a CUDA device the batches come in pinned memory (contiguous), so
    `.to(device, non_blocking=True)` overlaps the copy with compute; elsewhere pinning is no use and is skipped.

    The thread alone touches `source` while it runs. `state_dict()` is the source's position after the last batch
    handed out (recorded with each batch by the thread): what a checkpoint must store, since the batches read ahead
    were not trained on. Stopping the thread (`load_state_dict`, `close`) puts the source back at that position.
    An exception in the thread is raised in the caller at the batch where it happened, and again on later calls."""

    def __init__(self, source: ShardLoader | ReplayLoader, depth: int = 2, device: torch.device | None = None):
        if depth < 1:
            raise ValueError(f"prefetch depth {depth} must be at least 1")
        self.source, self.depth = source, depth
        self.device = device if device is not None and device.type == "cuda" else None  # pin only for CUDA
        self._state = source.state_dict()
        self._thread: threading.Thread | None = None
        self._queue: queue.Queue | None = None
        self._stop = threading.Event()
        self._error: BaseException | None = None

    @property
    def seq_len(self) -> int:
        return self.source.seq_len

    @property
    def shard_set(self):
        return self.source.shard_set

    def long_document_share(self, length: int) -> float:
        return self.source.long_document_share(length)

    def phase_at(self, state: dict[str, Any]) -> str:
        return self.source.phase_at(state)

    def roles(self) -> dict[str, ShardLoader]:
        return self.source.roles()

    def next_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        if self._error is not None:
            raise self._error
        if self._thread is None:
            self._start()
        item = self._queue.get()
        if isinstance(item, BaseException):
            self._error = item
            self._halt()
            raise item
        x, y, self._state = item
        return x, y

    def state_dict(self) -> dict[str, Any]:
        return dict(self._state)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._halt()
        self.source.load_state_dict(state)
        self._state, self._error = self.source.state_dict(), None

    def close(self) -> None:
        """Stop the thread; the source stands at the position of the batches handed out."""
        self._halt()

    def _start(self) -> None:
        self._stop = threading.Event()
        self._queue = queue.Queue(maxsize=self.depth)
        # The thread holds no reference to self: a prefetcher dropped without close() is collected and stops it.
        self._thread = threading.Thread(target=_read_ahead, args=(self.source, self.device, self._queue, self._stop),
                                        name="kiln-prefetch", daemon=True)
        weakref.finalize(self, self._stop.set)
        self._thread.start()

    def _halt(self) -> None:
        if self._thread is None:
            return
        self._stop.set()
        self._thread.join()
        self._thread = self._queue = None
        if self._error is None:
            self.source.load_state_dict(self._state)  # forget what was read ahead


def _read_ahead(source: ShardLoader | ReplayLoader, device: torch.device | None, out: queue.Queue,
                stop: threading.Event) -> None:
    """The prefetch thread: batches with the source's position after each, or the exception that stopped it."""
    if device is not None:
        torch.cuda.set_device(device)  # pinned memory belongs to the current device's context
    try:
        while not stop.is_set():
            x, y = source.next_batch()
            if device is not None:
                x, y = _pinned(x), _pinned(y)
            if not _put(out, (x, y, source.state_dict()), stop):
                return
    except BaseException as exc:  # handed to the caller, raised at its next batch
        _put(out, exc, stop)


def _pinned(t: torch.Tensor) -> torch.Tensor:
    """A contiguous copy in page-locked memory: an asynchronous copy to the GPU needs both."""
    return torch.empty(t.shape, dtype=t.dtype, pin_memory=True).copy_(t)


def _put(out: queue.Queue, item: Any, stop: threading.Event) -> bool:
    """Put unless told to stop (checked while the queue is full); False when stopped."""
    while not stop.is_set():
        try:
            out.put(item, timeout=0.05)
            return True
        except queue.Full:
            continue
    return False
