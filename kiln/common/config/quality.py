"""Config section `quality`: the classifier, the perplexity model and each source's filtering rule."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from kiln.common.config.base import Strict


class QualityClassifier(Strict):
    """A fastText "reference vs web" classifier (GPT-3, DCLM): documents of reference sources are the
    positives, documents of web sources the negatives; every document then gets P(reference)."""

    enabled: bool | Literal["auto"] = "auto"  # auto: on when there are positive and negative sources
    positive_sources: list[str] | None = None  # None: every source with domain 'reference'
    negative_sources: list[str] | None = None  # None: every source with domain 'web'
    max_documents_per_class: int = Field(20_000, gt=0)  # classes are balanced to the smaller one, up to this
    folds: int = Field(5, ge=2, le=20)  # cross-fitting: out-of-fold scores for the sample's own documents
    max_words: int = Field(1000, gt=0)  # a document's first words the classifier sees (a Han character 5/8 of one)
    epochs: int = Field(20, gt=0)
    lr: float = Field(0.5, gt=0)
    word_ngrams: int = Field(2, ge=1, le=5)
    dim: int = Field(64, gt=0)
    min_count: int = Field(1, ge=1)
    threads: int = Field(1, ge=1)  # 1 trains bit-reproducibly; more threads train faster (Hogwild), not reproducibly
    seed: int = 0
    # fastText's quantize (Joulin et al. 2016, "FastText.zip"): keep this many features of largest norm and
    # product-quantize them. Under 1 MB instead of (2M hash buckets + vocabulary) x dim x 4 bytes, 515 MB at dim 64;
    # the cross-validated AUC is measured on quantized fold models. Quantizing adds ~4.5 s per fit at 10,000 (k-means
    # over the kept rows, one core); raise it for samples far larger than the demo's. None: keep the full model.
    quantize_cutoff: int | None = Field(10_000, ge=1_000)

    @field_validator("dim")
    @classmethod
    def _dim_fasttext_trains_right(cls, dim: int) -> int:
        # Measured with fasttext-numpy2 0.10.4, thread 1, seed 0: below 8 the same fit gives different models call
        # after call in one process and fails with "Encountered NaN" every few calls (whatever lr); from 8 up, the
        # same model every time.
        if dim < 8:
            raise ValueError(f"dim is {dim}: fastText trains unreproducibly below 8 (different models from the same "
                             "data, 'Encountered NaN'); use 8 or more (default 64)")
        return dim


class QualityPerplexity(Strict):
    """CCNet-style perplexity of every document under a reference language model (a Kiln checkpoint)."""

    model: str | None = None  # a checkpoint folder as the checkpoint asset writes it; None: no perplexity
    max_tokens: int = Field(512, ge=2)  # a document's first tokens are scored (capped by the model's context)
    batch_size: int = Field(16, gt=0)
    device: str = Field("auto", pattern=r"^(auto|cpu|cuda(:\d+)?|mps)$")  # auto: cuda when available, else cpu


class QualityRule(Strict):
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

    @property
    def ranks_scores(self) -> bool:
        """Whether the rule cuts among the classifier scores of every refresh of its source (`keep_top_fraction`):
        those must all come from one fit of the classifier."""
        return self.keep_top_fraction is not None


class Quality(Strict):
    classifier: QualityClassifier = QualityClassifier()
    perplexity: QualityPerplexity = QualityPerplexity()
    rules: dict[str, QualityRule] = Field(default_factory=dict)  # source -> rule; unlisted sources keep everything
