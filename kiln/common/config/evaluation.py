"""Config section `evaluation`: what the evaluation asset measures on a checkpoint."""

from __future__ import annotations

from pydantic import Field

from kiln.common.config.base import Strict


class EvaluationSettings(Strict):
    """What the evaluation asset measures on a checkpoint (bounded, so it stays cheap on CPU)."""

    max_val_tokens: int = Field(200_000, gt=0)  # from the validation shards
    max_tokens_per_source: int = Field(50_000, gt=0)  # validation documents of each source, tokenized
    batch_size: int = Field(8, gt=0)
    sample_tokens: int = Field(48, ge=0)  # continuation length for each probe prompt (greedy)
