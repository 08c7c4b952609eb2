"""Config sections `dedup` (exact, near-duplicate and boilerplate-line settings) and `decontamination`."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from kiln.common.config.base import Strict
from kiln.dedup.lsh import choose_bands


class ShingleNormalization(Strict):
    """How text is normalized before shingling, so that trivial edits do not hide a copy."""

    lowercase: bool = True
    strip_punctuation: bool = True  # words are runs of letters/digits/underscore; everything else separates
    digits: Literal["keep", "zero", "remove"] = "zero"  # "zero" maps every digit to 0 (dates, versions, counters)


class NearDedup(Strict):
    enabled: bool = True
    shingle_size: int = Field(5, ge=1, le=32)  # words per shingle
    num_perm: int = Field(128, ge=16, le=1024)  # MinHash permutations
    threshold: float = Field(0.8, gt=0, lt=1)  # Jaccard at or above which two documents are near-duplicates
    # LSH bands x rows (bands * rows <= num_perm). Unset: the pair with the fewest candidates below the
    # threshold among those that find >= min_recall of pairs *at* the threshold (candidates are verified).
    bands: int | None = Field(None, ge=1)
    rows: int | None = Field(None, ge=1)
    min_recall: float = Field(0.99, gt=0, lt=1)
    seed: int = 1
    normalization: ShingleNormalization = ShingleNormalization()
    # How shingles are hashed and signatures drawn (kiln.dedup.minhash): fss-splitmix64-v1 signs whole batches with
    # numpy and compiled loops (about 14x affine32's speed), affine32 is blake2b shingles + datasketch MinHash.
    # Indexes built with the other scheme are refused (their shingle hashes and signatures are not comparable).
    scheme: Literal["fss-splitmix64-v1", "affine32"] = "fss-splitmix64-v1"
    # Which document of a cluster is kept; earlier criteria decide first. Documents already in the index
    # (accepted by an earlier refresh) always win: they may already be in token shards.
    keep: list[Literal["quality_tier", "first_seen", "longest"]] = ["quality_tier", "first_seen", "longest"]
    check_sample: int = Field(500, ge=0)  # survivors re-checked pairwise by exact Jaccard in an asset check
    # The bucket shuffle (kiln.dedup.buckets): key-prefix partitions are the tasks of each shuffled round, and a
    # partition's rows are one task's memory. Unset: one per ~250k band-key rows of this and the earlier refreshes
    # (at least 8), so that memory stays flat as the corpus grows. A bucket of more than max_bucket documents pairs
    # each member with its first max_bucket only: boilerplate buckets stay linear.
    partitions: int | None = Field(None, ge=1, le=65_536)
    max_bucket: int = Field(1_000, ge=2)
    # Documents per signature part (consecutive curated parts joined): the unit of every near-dup task after the
    # signatures. Parts of a few hundred documents make tens of thousands of tiny shuffle files per 100k documents.
    rows_per_part: int = Field(5_000, ge=1)

    @model_validator(mode="after")
    def _bands_rows(self):
        if (self.bands is None) != (self.rows is None):
            raise ValueError("set both dedup.near.bands and dedup.near.rows, or neither (then they are chosen "
                             "for min_recall at the threshold)")
        if self.bands is not None and self.bands * self.rows > self.num_perm:
            raise ValueError(f"bands x rows = {self.bands} x {self.rows} = {self.bands * self.rows} exceeds "
                             f"num_perm = {self.num_perm}; lower one of them or raise num_perm")
        if self.bands is None:  # chosen now, not first inside dedup_index: a min_recall out of reach is refused here
            choose_bands(self.num_perm, self.threshold, self.min_recall)
        if len(set(self.keep)) != len(self.keep):
            raise ValueError(f"dedup.near.keep lists a criterion twice: {self.keep}")
        return self


class BoilerplateLines(Strict):
    """Remove lines that recur across many documents (navigation, cookie banners, license headers)."""

    enabled: bool = False
    min_documents: int = Field(100, ge=2)  # a line in more documents than this is boilerplate
    min_chars: int = Field(10, ge=1)  # shorter lines (blank, braces, "}") are never counted


class Dedup(Strict):
    near: NearDedup = NearDedup()
    boilerplate_lines: BoilerplateLines = BoilerplateLines()


class Benchmark(Strict):
    """An evaluation set whose items must not appear in training data: a JSONL file of items."""

    name: str = Field(pattern=r"^[A-Za-z][A-Za-z0-9_.-]{0,62}$")
    path: str
    text_fields: list[str] = Field(["text"], min_length=1)  # fields joined to form the item's text
    id_field: str | None = "id"


class Decontamination(Strict):
    enabled: bool = True
    ngram: int = Field(13, ge=3, le=64)  # words; GPT-3 and most successors use 13
    min_item_words: int = Field(8, ge=1)  # shorter items use all their words as one n-gram; below this, skipped
    # Edited copies (kiln.dedup.decontaminate explains both rules). Aligned: the whole item in one place with at
    # most this share of its words replaced, deleted or inserted (a 19-word item: 3 edits; one sentence inserted
    # into the item word for word: 1); null: off
    max_edit_share: float | None = Field(0.2, ge=0, lt=1)
    # Share: at least min_share of an item's distinct `fuzzy_ngram`-word n-grams, and at least min_shared_ngrams
    # of them (a few common phrases make a large share of a short item); min_share null: off
    min_share: float | None = Field(0.4, gt=0, le=1)
    min_shared_ngrams: int = Field(20, ge=1)
    fuzzy_ngram: int = Field(4, ge=3, le=13)
    mode: Literal["drop", "redact"] = "drop"  # redact cuts the overlapping spans (plus margin) instead
    redact_margin_chars: int = Field(200, ge=0)
    min_chars_after_redact: int = Field(200, ge=0)  # a redacted document shorter than this is dropped
    benchmarks: list[Benchmark] = []
