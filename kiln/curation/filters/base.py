"""What every curation step is: a small unit that keeps (maybe rewriting the text) or drops with a reason.

A step is a dataclass whose fields are its parameters, defaulting to the published thresholds; the
config overrides them by name. `__call__` takes a `Document` and returns a `Verdict`. Reasons are
`"<step name>.<rule>"` (e.g. `"gopher_quality.min_doc_words"`) so funnels group by step and rule.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar, Protocol

from kiln.curation.documents import Document


@dataclass(frozen=True)
class Verdict:
    text: str  # the (possibly rewritten) text to pass on
    drop: str | None = None  # None keeps the document; otherwise "<step>.<rule>"
    counts: dict[str, int] = field(default_factory=dict)  # what a rewrite did, e.g. {"email": 2}

    @property
    def kept(self) -> bool:
        return self.drop is None


class Step(Protocol):
    name: ClassVar[str]

    def __call__(self, doc: Document) -> Verdict: ...


def keep(text: str, **counts: int) -> Verdict:
    return Verdict(text=text, counts={k: v for k, v in counts.items() if v})


def drop(step: str, rule: str, text: str) -> Verdict:
    return Verdict(text=text, drop=f"{step}.{rule}")
