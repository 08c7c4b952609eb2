"""Config section `card`: what the data card states that no manifest holds (who the data is for, what it must not be
used for, what is known to be wrong with it, who keeps it), and where each document's own licence is recorded.

The statement fields follow the data-card practice reviewers already know:
- Datasheets for Datasets (Gebru et al., 2021, Communications of the ACM 64(12), doi:10.1145/3458723): Motivation
  (`summary`), Uses (`intended_use`, `out_of_scope_use`: "Are there tasks for which the dataset should not be
  used?"), Composition and Collection process (`limitations`, `known_biases`), Maintenance (`maintainers`,
  `contact`);
- Hugging Face dataset cards (huggingface.co/docs/hub/datasets-cards): "Dataset Summary", "Direct Use",
  "Out-of-Scope Use", "Bias, Risks, and Limitations", "Dataset Card Contact", "Citation".
An unset statement is printed on the card as "not stated", with the key to set, so a reviewer sees what is missing.
"""

from __future__ import annotations

from pydantic import Field, field_validator

from kiln.common.config.base import Strict


class CardSettings(Strict):
    summary: str | None = None  # what the dataset is and why it was built (Datasheets: Motivation)
    intended_use: list[str] = Field(default_factory=list)  # uses it was built for (HF: Direct Use)
    out_of_scope_use: list[str] = Field(default_factory=list)  # uses it must not be put to (HF: Out-of-Scope Use)
    limitations: list[str] = Field(default_factory=list)  # known gaps and risks (HF: Bias, Risks, and Limitations)
    known_biases: list[str] = Field(default_factory=list)  # skews in what was collected (Datasheets: Composition)
    maintainers: list[str] = Field(default_factory=list)  # who keeps the data and the card (Datasheets: Maintenance)
    contact: str | None = None  # where to send questions and removal requests (HF: Dataset Card Contact)
    citation: str | None = None  # how to cite the dataset (HF: Citation), e.g. a BibTeX entry
    # source -> the `meta` key holding each document's own licence (e.g. the licence its package declares); a
    # document whose key is missing, null, empty or UNKNOWN counts as unknown. Other sources: their `license`.
    license_fields: dict[str, str] = Field(default_factory=dict)
    list_unknown_licenses: int = Field(20, ge=0)  # documents of unknown licence listed per source in the markdown

    @field_validator("intended_use", "out_of_scope_use", "limitations", "known_biases", "maintainers",
                     mode="before")
    @classmethod
    def _one_or_many(cls, value):
        return [value] if isinstance(value, str) else value
