"""What every curation step is: a small unit that keeps (maybe rewriting the text) or drops with a reason.

A step is a dataclass whose fields are its parameters, defaulting to the published thresholds; the
config overrides them by name. A field's type bounds its values (`Fraction`, pydantic's `NonNegativeInt` ...: the
registry checks them when the config loads), and a step's `__post_init__` checks its pairs (`ordered`).
`__call__` takes a `Document` and returns a `Verdict`. Reasons are `"<step name>.<rule>"` (e.g.
`"gopher_quality.min_doc_words"`) so funnels group by step and rule.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated, Any, ClassVar, Protocol

from annotated_types import Interval

from kiln.curation.documents import Document

# A share of something (of words, lines, characters): 0 to 1. A rule that drops at `share >= threshold` takes one over
# 0 (at 0 it would drop every document), one that drops at `share <= threshold` takes one under 1.
Fraction = Annotated[float, Interval(ge=0, le=1)]


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


def ordered(step: Any, low: str, high: str) -> None:
    """For a step's __post_init__: its lower bound `low` may not be above its upper bound `high` (no document could
    pass both: the step would drop everything). None is no bound."""
    lo, hi = getattr(step, low), getattr(step, high)
    if lo is not None and hi is not None and lo > hi:
        raise ValueError(f"{low} ({lo!r}) is above {high} ({hi!r}), so no document can pass both: lower {low} or "
                         f"raise {high} (null turns a rule off)")
