"""Config sections `tokenizer`, `mixture` (weights, phases, replay) and `shards` (with FIM)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import ConfigDict, Field, field_validator, model_validator

from kiln.common.config.base import Strict


SPECIAL_ROLES = ("bos", "eos", "pad", "unk", "fim_prefix", "fim_suffix", "fim_middle")
# The keys that only shape a tokenizer trained here; a brought one has its own vocabulary and special tokens.
TRAINING_KEYS = ("vocab_size", "model_type", "byte_fallback", "split_digits", "character_coverage", "max_piece_length",
                 "max_sentence_chars", "num_threads", "normalization", "add_dummy_prefix", "remove_extra_whitespaces",
                 "sentinel_tokens")


class TokenizerSettings(Strict):
    """The sentencepiece model trained on a mixture-weighted sample, or a tokenizer brought as a file. The training
    defaults keep text exact: decode(encode(text)) == text for any text; changing the normalization keys gives that up.
    The sample keys (sample_documents, sample_chars, seed) also choose the documents a brought tokenizer's round-trip
    and fit reports are measured on."""

    # `train`, or a local path to a Hugging Face `tokenizers` file (tokenizer.json) or a SentencePiece model (.model)
    source: str = "train"
    # role -> token, for a brought tokenizer whose special tokens have other names (e.g. {eos: "<|end_of_text|>"})
    special_tokens: dict[Literal[SPECIAL_ROLES], str] = Field(default_factory=dict)
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
    seed: int = Field(0, ge=0, lt=2**32)  # SentencePiece's random generator takes a uint32
    num_threads: int = Field(0, ge=0)  # sentencepiece trainer threads; 0 means one per core
    normalization: Literal["identity", "nfkc"] = "identity"  # nfkc folds look-alike characters: not exact
    add_dummy_prefix: bool = False  # True prepends a space to every text: not exact
    remove_extra_whitespaces: bool = False  # True collapses runs of spaces (breaks code indentation)
    sentinel_tokens: int = Field(0, ge=0, le=1000)  # <extra_id_0>.. after the fixed ids: span corruption (T5: 100)

    @property
    def exact(self) -> bool:
        """Whether a tokenizer trained with these settings keeps every text exact, as the defaults do: not once a key
        gives that up (nfkc, a dummy prefix, collapsed whitespace, or byte_fallback off: unseen characters become
        <unk>). A brought tokenizer is as exact as its file: False."""
        return (self.source == "train" and self.normalization == "identity" and self.byte_fallback
                and not self.add_dummy_prefix and not self.remove_extra_whitespaces)

    def applicable(self) -> dict:
        """The settings that shape the tokenizer, as manifests and cards record them: every key when it is trained
        here; the source, special tokens and sample keys when it is brought (the file fixes the rest)."""
        return self.model_dump(mode="json", exclude=set(TRAINING_KEYS) if self.source != "train" else None)

    @field_validator("source")
    @classmethod
    def _source(cls, value: str) -> str:
        if value == "train":
            return value
        path = Path(value).expanduser()
        if path.suffix not in (".json", ".model"):
            raise ValueError(f"give `train`, or a Hugging Face tokenizers file (tokenizer.json) or a SentencePiece "
                             f"model (*.model); {value!r} ends in neither .json nor .model")
        if not path.is_file():
            raise ValueError(f"no such file{' (a folder)' if path.is_dir() else ''} (relative paths are read from "
                             f"{Path.cwd()}); give the path of an existing tokenizer.json or .model, or `train`")
        return value

    @model_validator(mode="after")
    def _keys_fit_the_source(self):
        if self.source == "train":
            if self.special_tokens:
                raise ValueError("tokenizer.special_tokens names the special tokens of a brought tokenizer "
                                 "(tokenizer.source: <file>); a tokenizer trained here has Kiln's own: remove it")
            return self
        # Refused rather than ignored: the recorded config would say e.g. vocab_size 8000 of a 32k tokenizer. A key
        # left at its default (as a dumped config has it) says nothing and passes.
        given = [k for k in TRAINING_KEYS if k in self.model_fields_set
                 and getattr(self, k) != type(self).model_fields[k].default]
        if given:
            raise ValueError(f"{', '.join('tokenizer.' + k for k in given)} only shape{'s' * (len(given) == 1)} a "
                             f"tokenizer trained here; "
                             f"tokenizer.source is the file {self.source!r}, whose vocabulary, normalization and "
                             f"special tokens are its own: remove {'them' if len(given) > 1 else 'it'} (or set "
                             f"tokenizer.source: train)")
        return self


def _check_weights(weights: dict[str, float]) -> dict[str, float]:
    bad = {k: v for k, v in weights.items() if not v >= 0 or v == float("inf")}
    if bad:
        raise ValueError(f"weights must be finite and >= 0; got {bad}")
    if weights and not any(v > 0 for v in weights.values()):
        raise ValueError("every weight is 0; give at least one source a positive weight "
                         "(or leave the weights empty for natural proportions)")
    return weights


class Phase(Strict):
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


class ReplaySettings(Strict):
    """Continued pretraining only: this share of the training sequences comes from earlier shards (by default
    those the base checkpoint was trained on), to limit forgetting (Ibrahim et al. 2024)."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)
    share: float = Field(gt=0, lt=1)
    from_: str | None = Field(None, alias="from")  # a token_shards folder; None: the base checkpoint's shards


class Mixture(Strict):
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


class Fim(Strict):
    """Fill-in-the-middle (Bavarian et al. 2022): a share of code documents is rearranged so the model
    learns to complete a middle from its prefix and suffix."""

    rate: float = Field(0.5, ge=0, le=1)  # share of documents of FIM sources that are rearranged
    spm_rate: float = Field(0.5, ge=0, le=1)  # of those, the share in suffix-prefix-middle order
    sources: list[str] | None = None  # None: every source with domain 'code'


class ShardSettings(Strict):
    seq_len: int = Field(512, ge=8)  # the training sequence length the shards are meant for (the loader's default)
    tokens_per_shard: int = Field(1 << 22, ge=1024)  # ~4M tokens (8 MB as uint16) per shard file
    val_fraction: float = Field(0.01, ge=0, lt=1)  # share of documents held out (by doc_id hash)
    seed: int = Field(1234, ge=0)  # shuffle, repetition subsets and FIM draws (numpy's generators: non-negative)
    fim: Fim = Fim()
    # Copies of the shards for other trainers (the shard_exports asset, kiln.tokens.interchange): Megatron-LM's
    # indexed dataset (.bin/.idx) and Parquet token ids for Hugging Face `datasets`. Each costs about the shards'
    # own disk again; [] (the default) exports nothing and the asset does not follow new shards.
    export: list[Literal["megatron", "parquet"]] = []
