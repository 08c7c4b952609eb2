"""The one project config model: sources, filter profiles, reading and curation settings.

Loaded from YAML (`KILN_CONFIG`, default `configs/default.yaml`) and validated with pydantic; a bad
value fails with `ConfigError` naming the key, the value given and what is allowed.
"""

from __future__ import annotations

import difflib
import os
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from kiln.curation.filters.registry import build_step, step_parameters
from kiln.planning.plan import PlanRequest
from kiln.common.removals import RejectedText
from training_jobs.settings import TrainingSettings

DEFAULT_CONFIG = "configs/default.yaml"

SourceKind = Literal["jsonl", "parquet", "text", "warc", "wet", "builtin"]
Domain = Literal["web", "code", "reference", "docs", "books", "academic", "legal", "conversational", "other"]
BuiltinCorpus = Literal["python_docs", "package_readmes", "package_licenses", "stdlib_code"]


class ConfigError(ValueError):
    """A config that cannot be used; the message says which key, what was given, and what is allowed."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class StepSpec(_Strict):
    """One curation step in a profile: a registered step name plus parameter overrides."""

    step: str
    params: dict[str, Any] = Field(default_factory=dict)


class Source(_Strict):
    name: str = Field(pattern=r"^[a-z][a-z0-9_]{0,62}$")
    kind: SourceKind
    path: str | None = None  # file, directory or glob; local or s3://bucket/prefix
    corpus: BuiltinCorpus | None = None  # which embedded corpus, for kind: builtin
    license: str
    domain: Domain
    quality_tier: int = Field(2, ge=1, le=5)  # 1 is the best; decides which copy of a duplicate is kept
    profile: str
    text_field: str = "text"
    id_field: str | None = "id"
    url_field: str | None = "url"
    max_documents: int | None = Field(None, gt=0)

    @model_validator(mode="after")
    def _path_or_corpus(self):
        if self.kind == "builtin" and self.corpus is None:
            raise ValueError(f"source {self.name!r} has kind 'builtin' but no 'corpus'; set corpus to one of "
                             f"{', '.join(BuiltinCorpus.__args__)}")
        if self.kind != "builtin" and not self.path:
            raise ValueError(f"source {self.name!r} has kind {self.kind!r} but no 'path' (a file, directory or glob)")
        return self


class Reading(_Strict):
    max_document_bytes: int = Field(5_000_000, gt=0)  # larger records are quarantined as too_large
    rows_per_part: int = Field(2_000, gt=0)  # documents per Parquet part: the unit of parallel work
    # A record whose strings are not valid Unicode (JSON may escape a lone UTF-16 surrogate, "\ud800"): quarantined
    # as invalid_unicode, or kept with each such code point replaced by U+FFFD (`replace`)
    unicode_errors: Literal["quarantine", "replace"] = "quarantine"


class ExactDedup(_Strict):
    enabled: bool = True
    lowercase: bool = True
    collapse_whitespace: bool = True


class Curation(_Strict):
    normalize: dict[str, Any] = Field(default_factory=dict)  # parameters of the `normalize` step
    pii: dict[str, Any] = Field(default_factory=dict)  # parameters of the `pii` step (runs last)
    exact_dedup: ExactDedup = ExactDedup()
    examples_per_reason: int = Field(3, ge=0, le=20)
    # What a document removed after intake keeps of its text, in the rejected tables and removal examples
    # (kiln.common.removals): none (default), a PII-redacted `excerpt`, or the `full` text, PII-redacted; true = full
    keep_rejected_text: RejectedText = "none"

    @field_validator("keep_rejected_text", mode="before")
    @classmethod
    def _boolean_rejected_text(cls, value):
        return {True: "full", False: "none"}.get(value, value) if isinstance(value, bool) else value

    @field_validator("normalize", "pii")
    @classmethod
    def _valid_step_params(cls, value, info):
        build_step(info.field_name, value)
        return value


class ShingleNormalization(_Strict):
    """How text is normalized before shingling, so that trivial edits do not hide a copy."""

    lowercase: bool = True
    strip_punctuation: bool = True  # words are runs of letters/digits/underscore; everything else separates
    digits: Literal["keep", "zero", "remove"] = "zero"  # "zero" maps every digit to 0 (dates, versions, counters)


class NearDedup(_Strict):
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
    # numpy (about 8x affine32's speed), affine32 is blake2b shingles + datasketch MinHash. Indexes built with the
    # other scheme are refused (their shingle hashes and signatures are not comparable).
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
        if len(set(self.keep)) != len(self.keep):
            raise ValueError(f"dedup.near.keep lists a criterion twice: {self.keep}")
        return self


class BoilerplateLines(_Strict):
    """Remove lines that recur across many documents (navigation, cookie banners, license headers)."""

    enabled: bool = False
    min_documents: int = Field(100, ge=2)  # a line in more documents than this is boilerplate
    min_chars: int = Field(10, ge=1)  # shorter lines (blank, braces, "}") are never counted


class Dedup(_Strict):
    near: NearDedup = NearDedup()
    boilerplate_lines: BoilerplateLines = BoilerplateLines()


class Benchmark(_Strict):
    """An evaluation set whose items must not appear in training data: a JSONL file of items."""

    name: str = Field(pattern=r"^[A-Za-z][A-Za-z0-9_.-]{0,62}$")
    path: str
    text_fields: list[str] = Field(["text"], min_length=1)  # fields joined to form the item's text
    id_field: str | None = "id"


class Decontamination(_Strict):
    enabled: bool = True
    ngram: int = Field(13, ge=3, le=64)  # words; GPT-3 and most successors use 13
    min_item_words: int = Field(8, ge=1)  # shorter items use all their words as one n-gram; below this, skipped
    # Edited copies (words changed, a sentence inserted): also flag a document holding at least this share of an
    # item's distinct `fuzzy_ngram`-word n-grams (and at least 3 of them); null: the exact `ngram` rule only
    min_share: float | None = Field(0.4, gt=0, le=1)
    fuzzy_ngram: int = Field(4, ge=3, le=13)
    mode: Literal["drop", "redact"] = "drop"  # redact cuts the overlapping spans (plus margin) instead
    redact_margin_chars: int = Field(200, ge=0)
    min_chars_after_redact: int = Field(200, ge=0)  # a redacted document shorter than this is dropped
    benchmarks: list[Benchmark] = []


# --- tokenizer, mixture and token shards

class TokenizerSettings(_Strict):
    """The sentencepiece model trained on a mixture-weighted sample. The defaults keep text exact:
    decode(encode(text)) == text for any text; changing the normalization keys gives that up."""

    # 7 special tokens and 256 byte pieces come first, so below ~300 nothing is left to learn
    vocab_size: int = Field(8000, ge=300, le=1 << 20)
    model_type: Literal["bpe", "unigram"] = "bpe"
    byte_fallback: bool = True  # unseen characters become UTF-8 byte pieces instead of <unk>
    split_digits: bool = True  # every digit its own piece: arithmetic sees aligned numbers
    character_coverage: float = Field(0.9995, gt=0, le=1)
    max_piece_length: int = Field(16, ge=1, le=64)
    sample_documents: int = Field(20_000, gt=0)  # at most this many documents in the training sample
    sample_chars: int = Field(20_000_000, gt=0)  # and at most this many characters
    max_sentence_chars: int = Field(2_048, ge=64, le=65_536)  # documents are cut at line ends into pieces this long
    seed: int = 0
    num_threads: int = Field(0, ge=0)  # sentencepiece trainer threads; 0 means one per core
    normalization: Literal["identity", "nfkc"] = "identity"  # nfkc folds look-alike characters: not exact
    add_dummy_prefix: bool = False  # True prepends a space to every text: not exact
    remove_extra_whitespaces: bool = False  # True collapses runs of spaces (breaks code indentation)
    sentinel_tokens: int = Field(0, ge=0, le=1000)  # <extra_id_0>.. after the fixed ids: span corruption (T5: 100)


def _check_weights(weights: dict[str, float]) -> dict[str, float]:
    bad = {k: v for k, v in weights.items() if not v >= 0 or v == float("inf")}
    if bad:
        raise ValueError(f"weights must be finite and >= 0; got {bad}")
    if weights and not any(v > 0 for v in weights.values()):
        raise ValueError("every weight is 0; give at least one source a positive weight "
                         "(or leave the weights empty for natural proportions)")
    return weights


class Phase(_Strict):
    """One stage of a curriculum: its own token budget and source weights; phases are read in order."""

    name: str = Field(pattern=r"^[a-z][a-z0-9_-]{0,62}$")
    tokens: int = Field(gt=0)  # training tokens drawn in this phase
    weights: dict[str, float] = Field(default_factory=dict)  # empty: mixture.weights (or natural proportions)
    # Only documents of at least this many tokens: a long-context phase packed from documents that fill its window.
    min_document_tokens: int | None = Field(None, gt=0)

    @field_validator("weights")
    @classmethod
    def _valid(cls, value):
        return _check_weights(value)


class ReplaySettings(_Strict):
    """Continued pretraining only: this share of the training sequences comes from earlier shards (by default
    those the base checkpoint was trained on), to limit forgetting (Ibrahim et al. 2024)."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)
    share: float = Field(gt=0, lt=1)
    from_: str | None = Field(None, alias="from")  # a token_shards folder; None: the base checkpoint's shards


class Mixture(_Strict):
    """How many tokens each source contributes to training. Weights are shares of training tokens;
    a source is repeated (whole passes plus a deterministic subset) or subsampled to hit its share."""

    weights: dict[str, float] = Field(default_factory=dict)  # empty: natural proportions, every source once
    token_budget: int | None = Field(None, gt=0)  # None: the natural total of training tokens
    max_epochs_warning: float = Field(4.0, gt=0)  # warn when a source is repeated more often than this
    phases: list[Phase] = []  # optional curriculum; none means one phase "main"
    replay: ReplaySettings | None = None  # with training.base_checkpoint: e.g. {share: 0.1}

    @field_validator("weights")
    @classmethod
    def _valid(cls, value):
        return _check_weights(value)

    @model_validator(mode="after")
    def _phases(self):
        names = [p.name for p in self.phases]
        if len(set(names)) != len(names):
            raise ValueError(f"mixture.phases: phase names must be unique; got {names}")
        if self.phases and self.token_budget is not None:
            raise ValueError("set either mixture.token_budget or per-phase tokens (mixture.phases[*].tokens), "
                             "not both: with phases the budget is their sum")
        return self


class Fim(_Strict):
    """Fill-in-the-middle (Bavarian et al. 2022): a share of code documents is rearranged so the model
    learns to complete a middle from its prefix and suffix."""

    rate: float = Field(0.5, ge=0, le=1)  # share of documents of FIM sources that are rearranged
    spm_rate: float = Field(0.5, ge=0, le=1)  # of those, the share in suffix-prefix-middle order
    sources: list[str] | None = None  # None: every source with domain 'code'


class ShardSettings(_Strict):
    seq_len: int = Field(512, ge=8)  # the training sequence length the shards are meant for (the loader's default)
    tokens_per_shard: int = Field(1 << 22, ge=1024)  # ~4M tokens (8 MB as uint16) per shard file
    val_fraction: float = Field(0.01, ge=0, lt=1)  # share of documents held out (by doc_id hash)
    seed: int = 1234  # shuffle, repetition subsets and FIM draws
    fim: Fim = Fim()


class EvaluationSettings(_Strict):
    """What the evaluation asset measures on a checkpoint (bounded, so it stays cheap on CPU)."""

    max_val_tokens: int = Field(200_000, gt=0)  # from the validation shards
    max_tokens_per_source: int = Field(50_000, gt=0)  # validation documents of each source, tokenized
    batch_size: int = Field(8, gt=0)
    sample_tokens: int = Field(48, ge=0)  # continuation length for each probe prompt (greedy)


class QualityClassifier(_Strict):
    """A fastText "reference vs web" classifier (GPT-3, DCLM): documents of reference sources are the
    positives, documents of web sources the negatives; every document then gets P(reference)."""

    enabled: bool | Literal["auto"] = "auto"  # auto: on when there are positive and negative sources
    positive_sources: list[str] | None = None  # None: every source with domain 'reference'
    negative_sources: list[str] | None = None  # None: every source with domain 'web'
    max_documents_per_class: int = Field(20_000, gt=0)  # classes are balanced to the smaller one, up to this
    folds: int = Field(5, ge=2, le=20)  # cross-fitting: out-of-fold scores for the sample's own documents
    max_words: int = Field(1000, gt=0)  # a document's first words (fastText tokens) the classifier sees
    epochs: int = Field(20, gt=0)
    lr: float = Field(0.5, gt=0)
    word_ngrams: int = Field(2, ge=1, le=5)
    dim: int = Field(64, gt=0)
    min_count: int = Field(1, ge=1)
    threads: int = Field(1, ge=1)  # 1 trains bit-reproducibly; more threads train faster (Hogwild), not reproducibly
    seed: int = 0


class QualityPerplexity(_Strict):
    """CCNet-style perplexity of every document under a reference language model (a Kiln checkpoint)."""

    model: str | None = None  # a checkpoint folder as the checkpoint asset writes it; None: no perplexity
    max_tokens: int = Field(512, ge=2)  # a document's first tokens are scored (capped by the model's context)
    batch_size: int = Field(16, gt=0)
    device: str = "auto"  # auto: cuda when available, else cpu


class QualityRule(_Strict):
    """How one source is filtered on its stored scores; the rules present all apply (a document must pass each)."""

    min_score: float | None = Field(None, ge=0, le=1)  # drop below this classifier score
    keep_top_fraction: float | None = Field(None, gt=0, le=1)  # keep this share with the highest classifier scores
    max_perplexity: float | None = Field(None, gt=0)  # drop above this perplexity
    perplexity_buckets: list[Literal["head", "middle", "tail"]] | None = None  # CCNet buckets to keep
    bucket_quantiles: tuple[float, float] = (0.3, 0.6)  # per-source perplexity quantiles between head|middle|tail

    @model_validator(mode="after")
    def _valid(self):
        low, high = self.bucket_quantiles
        if not 0 < low < high < 1:
            raise ValueError(f"bucket_quantiles must be two increasing numbers in (0, 1), got {self.bucket_quantiles}")
        if self.perplexity_buckets is not None and not self.perplexity_buckets:
            raise ValueError("perplexity_buckets is empty: it would drop every document; list the buckets to keep")
        return self

    @property
    def uses_perplexity(self) -> bool:
        return self.max_perplexity is not None or self.perplexity_buckets is not None

    @property
    def uses_score(self) -> bool:
        return self.min_score is not None or self.keep_top_fraction is not None


class StorageSettings(_Strict):
    """Where artifacts live: `local` (files under KILN_HOME/data), or `s3`: every dataset, tokenizer, shard set,
    and checkpoint export (the near-dup index included: it is part of the dedup_index datasets) durably in a bucket, with KILN_HOME as a cache kept in sync.
    Endpoint, region and credentials come from the S3 resource (dagster-aws `S3Resource`: its fields, or the
    standard AWS_* environment variables)."""

    backend: Literal["local", "s3"] = "local"
    bucket: str | None = None
    prefix: str = Field("kiln", pattern=r"^[A-Za-z0-9._/-]*$")  # key prefix inside the bucket ("" for the root)
    create_bucket: bool = False  # create a missing bucket instead of failing with an error naming it

    @field_validator("bucket")
    @classmethod
    def _bucket_name(cls, value):
        import re

        if value is not None and not re.fullmatch(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]", value):
            raise ValueError(f"{value!r} is not a valid S3 bucket name: 3 to 63 lowercase letters, digits, dots or "
                             f"hyphens, starting and ending with a letter or digit")
        return value

    @model_validator(mode="after")
    def _bucket_for_s3(self):
        if self.backend == "s3" and not self.bucket:
            raise ValueError("storage.backend is 's3' but storage.bucket is not set; name the bucket "
                             "(storage.bucket: my-bucket) or use storage.backend: local")
        return self


class RefreshSchedule(_Strict):
    enabled: bool = True  # the schedule runs from the moment the code location loads (else: turn it on in the UI)
    cron: str = "0 3 * * 1"  # default weekly: Mondays 03:00
    timezone: str = "UTC"

    @field_validator("cron")
    @classmethod
    def _five_fields(cls, value):
        if len(value.split()) != 5:
            raise ValueError(f"{value!r} is not a cron expression of 5 fields (minute hour day month weekday), "
                             f"e.g. '0 3 * * 1' for Mondays 03:00")
        return value


class RefreshSensor(_Strict):
    enabled: bool = True  # the landing sensor runs from the moment the code location loads
    interval_seconds: int = Field(300, ge=30)  # how often the landing area is scanned
    settle_seconds: int = Field(60, ge=0)  # a file modified more recently may still be written: next scan


class RefreshSettings(_Strict):
    """Periodic corpus refreshes. New files under `<landing>/<source>/` become a refresh: a new `refresh`
    partition of every document asset, deduplicated against everything earlier (exact hashes and the
    persistent MinHash index), and a new version of the token shards."""

    landing: str | None = None  # a folder or s3://bucket/prefix of <source>/ folders; None: KILN_HOME/landing
    schedule: RefreshSchedule = RefreshSchedule()  # scans the landing area on a cron
    sensor: RefreshSensor = RefreshSensor()  # scans it every few minutes
    automation: bool = True  # downstream data assets (through the token shards) follow a refresh eagerly
    train: bool = False  # training_run (and what follows) starts on new token shards too; off: only by hand

    def landing_path(self) -> str:
        return self.landing or str(kiln_home() / "landing")


class Quality(_Strict):
    classifier: QualityClassifier = QualityClassifier()
    perplexity: QualityPerplexity = QualityPerplexity()
    rules: dict[str, QualityRule] = Field(default_factory=dict)  # source -> rule; unlisted sources keep everything


class EngineSettings(_Strict):
    """Where the per-document stages run (kiln.engine): Ray, or a process pool on this machine."""

    backend: Literal["ray", "processes"] = "ray"
    # unset: Ray's own RAY_ADDRESS, else an embedded local Ray; `auto` or `host:port` (the head's GCS address)
    ray_address: str | None = None
    workers: int = Field(0, ge=0)  # concurrent part tasks; 0 = every CPU of the cluster (pool: of this machine)

    @field_validator("ray_address")
    @classmethod
    def _not_empty(cls, value):
        return value or None


# Keys that moved; an old config fails with where they live now.
MOVED_KEYS = {("curation", "workers"): "engine.workers", ("dedup", "workers"): "engine.workers",
              ("shards", "workers"): "engine.workers"}
# Keys that are gone; an old config fails with what to do instead.
REMOVED_KEYS = {("dedup", "near", "index"): "removed: the near-dup index is now part of each refresh's dedup_index "
                                            "dataset (on the store, local or S3; no Redis). Delete dedup.near.index "
                                            "from the config, and run `kiln dedup migrate-index` once if this store "
                                            "was indexed before"}


class ProjectConfig(_Strict):
    sources: list[Source] = Field(min_length=1)
    profiles: dict[str, list[StepSpec]]
    reading: Reading = Reading()
    curation: Curation = Curation()
    dedup: Dedup = Dedup()
    decontamination: Decontamination = Decontamination()
    planning: PlanRequest = PlanRequest()  # `kiln plan` and the training_plan asset start from these
    training: TrainingSettings = TrainingSettings()  # the model, optimizer, schedule, checkpoints, monitor
    evaluation: EvaluationSettings = EvaluationSettings()
    tokenizer: TokenizerSettings = TokenizerSettings()
    mixture: Mixture = Mixture()
    shards: ShardSettings = ShardSettings()
    quality: Quality = Quality()
    storage: StorageSettings = StorageSettings()  # local files, or S3 with KILN_HOME as the cache
    refresh: RefreshSettings = RefreshSettings()  # new raw data: landing area, schedule, sensor, automation
    engine: EngineSettings = EngineSettings()  # Ray (embedded, or a cluster) or a local process pool

    @field_validator("profiles", mode="before")
    @classmethod
    def _parse_profiles(cls, value):
        """Accept `- gopher_quality` or `- gopher_quality: {min_doc_words: 20}` and check each step."""
        if not isinstance(value, dict):
            return value
        parsed = {}
        for profile, steps in value.items():
            if not isinstance(steps, list):
                raise ValueError(f"profile {profile!r} must be a list of steps, got {steps!r}")
            specs = []
            for i, item in enumerate(steps):
                if isinstance(item, str):
                    name, params = item, {}
                elif isinstance(item, dict) and set(item) == {"step", "params"}:  # a dumped config, read back
                    name, params = item["step"], item["params"]
                elif isinstance(item, dict) and len(item) == 1:
                    (name, params), = item.items()
                    params = params or {}
                else:
                    raise ValueError(f"profiles.{profile}[{i}]: expected a step name or {{name: {{params}}}}, got {item!r}")
                try:
                    build_step(name, params)
                except (TypeError, ValueError) as exc:
                    raise ValueError(f"profiles.{profile}[{i}] ({name}): {exc}") from None
                specs.append({"step": name, "params": params})
            parsed[profile] = specs
        return parsed

    @model_validator(mode="after")
    def _consistent(self):
        names = [s.name for s in self.sources]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"source names must be unique; repeated: {dupes}")
        for s in self.sources:
            if s.profile not in self.profiles:
                raise ValueError(f"source {s.name!r} uses profile {s.profile!r}, which is not defined; "
                                 f"defined profiles: {sorted(self.profiles)}")
        return self

    @model_validator(mode="after")
    def _recipes_have_what_they_need(self):
        if self.mixture.replay is not None and self.training.base_checkpoint is None:
            raise ValueError("mixture.replay mixes earlier data into a continued run: set training.base_checkpoint "
                             "(a checkpoint folder, or `latest`), or remove mixture.replay")
        phases = [p.name for p in self.mixture.phases] or ["main"]
        unknown = sorted(set(self.training.phases or []) - set(phases))
        if unknown:
            raise ValueError(f"training.phases names {unknown}, which mixture.phases does not define (phases: "
                             f"{phases}); a run reads curriculum phases of its token shards by name")
        if self.training.objective == "span_corruption" and self.tokenizer.sentinel_tokens == 0:
            raise ValueError("training.objective span_corruption needs sentinel tokens: set "
                             "tokenizer.sentinel_tokens (T5 uses 100) so the tokenizer reserves <extra_id_N>")
        return self

    @model_validator(mode="after")
    def _mixture_names_sources(self):
        """Weights and FIM sources must name declared sources; non-empty weights must name all of them,
        so adding a source never silently drops it from (or adds it to) training."""
        names = [s.name for s in self.sources]
        tables = [("mixture.weights", self.mixture.weights)]
        tables += [(f"mixture.phases[{i}].weights", p.weights) for i, p in enumerate(self.mixture.phases)]
        for key, weights in tables:
            unknown = sorted(set(weights) - set(names))
            if unknown:
                raise ValueError(f"{key} names unknown source {unknown[0]!r}; sources: {names}")
            missing = [n for n in names if n not in weights]
            if weights and missing:
                raise ValueError(f"{key} gives no weight to source(s) {missing}; list every source (weight 0 "
                                 f"leaves one out) or leave {key} empty for natural proportions")
        unknown_fim = sorted(set(self.shards.fim.sources or []) - set(names))
        if unknown_fim:
            raise ValueError(f"shards.fim.sources names unknown source {unknown_fim[0]!r}; sources: {names}")
        return self

    @model_validator(mode="after")
    def _quality_names_sources(self):
        names = [s.name for s in self.sources]
        q = self.quality
        for key, listed in [("quality.rules", list(q.rules)), ("quality.classifier.positive_sources",
                             q.classifier.positive_sources or []), ("quality.classifier.negative_sources",
                                                                     q.classifier.negative_sources or [])]:
            unknown = sorted(set(listed) - set(names))
            if unknown:
                raise ValueError(f"{key} names unknown source {unknown[0]!r}; sources: {names}")
        positives, negatives = self.quality_classes()
        if q.classifier.enabled is True and not (positives and negatives):
            raise ValueError("quality.classifier needs positive and negative sources: set "
                             "quality.classifier.positive_sources / negative_sources (defaults: domain 'reference' "
                             "/ 'web'), or set quality.classifier.enabled: false")
        if set(positives) & set(negatives):
            raise ValueError(f"quality.classifier: {sorted(set(positives) & set(negatives))} is both positive and "
                             "negative; a source belongs to one class")
        for name, rule in q.rules.items():
            if rule.uses_score and not self.quality_classifier_enabled:
                raise ValueError(f"quality.rules.{name} filters on the classifier score, but the classifier is off "
                                 f"(quality.classifier.enabled: {q.classifier.enabled}; positive sources {positives}, "
                                 f"negative sources {negatives}); enable it or drop min_score / keep_top_fraction")
            if rule.uses_perplexity and not q.perplexity.model:
                raise ValueError(f"quality.rules.{name} filters on perplexity, but quality.perplexity.model is not "
                                 "set; point it at a Kiln checkpoint folder or drop the perplexity rule")
        return self

    @property
    def quality_classifier_enabled(self) -> bool:
        positives, negatives = self.quality_classes()
        enabled = self.quality.classifier.enabled
        return enabled is True or (enabled == "auto" and bool(positives) and bool(negatives))

    def quality_classes(self) -> tuple[list[str], list[str]]:
        """The classifier's positive (reference) and negative (web) sources."""
        c = self.quality.classifier
        positives = c.positive_sources if c.positive_sources is not None else [
            s.name for s in self.sources if s.domain == "reference"]
        negatives = c.negative_sources if c.negative_sources is not None else [
            s.name for s in self.sources if s.domain == "web"]
        return positives, negatives

    def source(self, name: str) -> Source:
        for s in self.sources:
            if s.name == name:
                return s
        raise KeyError(f"no source named {name!r}; sources: {[s.name for s in self.sources]}")

    def profile_for(self, source: str) -> list[StepSpec]:
        return self.profiles[self.source(source).profile]


def kiln_home() -> Path:
    """Where Kiln keeps data, checkpoints, Dagster and MLflow state (`KILN_HOME`, default ./.kiln)."""
    return Path(os.environ.get("KILN_HOME", ".kiln")).resolve()


def config_path() -> Path:
    return Path(os.environ.get("KILN_CONFIG", DEFAULT_CONFIG))


def load_config(path: str | Path | None = None) -> ProjectConfig:
    """The project config at `path` (default: $KILN_CONFIG). A file may start from another with
    `extends: other.yaml` (relative to itself): its keys are merged over the other's, mappings key by key,
    anything else (lists and empty mappings included) replaced."""
    path = Path(path) if path is not None else config_path()
    return parse_config(_read_yaml(path), origin=str(path))


def _read_yaml(path: Path, seen: tuple[Path, ...] = ()) -> dict[str, Any]:
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except FileNotFoundError:
        hint = f"(extended by {seen[-1]})" if seen else f"set KILN_CONFIG or create {DEFAULT_CONFIG}"
        raise ConfigError(f"config file {str(path)!r} not found; {hint}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: a config is a mapping of keys (sources, training, ...), got {type(raw).__name__}")
    parent = raw.pop("extends", None)
    if parent is None:
        return raw
    parent_path = (path.parent / str(parent)).resolve()
    if parent_path in seen or parent_path == path.resolve():
        raise ConfigError(f"{path}: extends {parent!r} makes a cycle ({' -> '.join(map(str, seen + (path,)))})")
    return merge_config(_read_yaml(parent_path, seen + (path.resolve(),)), raw)


def merge_config(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    """`override` over `base`: mappings merge key by key; any other value, and an empty mapping, replaces."""
    out = dict(base)
    for key, value in override.items():
        out[key] = merge_config(out[key], value) if value and isinstance(value, dict) and \
            isinstance(out.get(key), dict) else value
    return out


def parse_config(raw: dict[str, Any], origin: str = "<config>") -> ProjectConfig:
    try:
        return ProjectConfig.model_validate(raw)
    except ValidationError as exc:
        raise ConfigError(f"{origin}: invalid config\n" + "\n".join(_describe(e) for e in exc.errors())) from None


def _describe(error: dict[str, Any]) -> str:
    key = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in error["loc"]).lstrip(".") or "(top level)"
    msg = error["msg"].removeprefix("Value error, ")
    if error["type"] == "extra_forbidden" and tuple(error["loc"]) in MOVED_KEYS:
        return f"  {key}: moved to {MOVED_KEYS[tuple(error['loc'])]} (one setting for every stage); move it there"
    if error["type"] == "extra_forbidden" and tuple(error["loc"]) in REMOVED_KEYS:
        return f"  {key}: {REMOVED_KEYS[tuple(error['loc'])]}"
    if error["type"] == "extra_forbidden":
        parent_fields = _fields_at(error["loc"][:-1])
        close = difflib.get_close_matches(str(error["loc"][-1]), parent_fields, n=1)
        hint = f"; did you mean {close[0]!r}?" if close else (f"; allowed keys: {', '.join(parent_fields)}" if parent_fields else "")
        return f"  {key}: unknown key{hint}"
    given = error.get("input")
    shown = "" if isinstance(given, dict) else f" = {given!r}"
    return f"  {key}{shown}: {msg}"


def _fields_at(loc: tuple) -> list[str]:
    """The allowed keys of the model found at `loc` (for 'did you mean' hints)."""
    model: type[BaseModel] | None = ProjectConfig
    for part in loc:
        if model is None or isinstance(part, int):
            continue
        field = model.model_fields.get(part)
        if field is None:
            return []
        ann = field.annotation
        inner = getattr(ann, "__args__", (ann,))
        model = next((a for a in inner if isinstance(a, type) and issubclass(a, BaseModel)), None)
    return sorted(model.model_fields) if model else []


__all__ = ["ConfigError", "EngineSettings", "ProjectConfig", "Source", "StepSpec", "kiln_home", "load_config",
           "parse_config", "step_parameters", "Quality",
           "QualityClassifier", "QualityPerplexity", "QualityRule", "RefreshSettings", "Fim", "Mixture", "Phase", "ShardSettings", "StorageSettings",
           "TokenizerSettings"]
