"""Fill-in-the-middle rearrangement (Bavarian et al. 2022, "Efficient Training of Language Models to
Fill in the Middle"), applied at the character level before tokenization.

A document chosen for FIM (probability `rate`, drawn per doc_id and seed) is cut at two uniformly
random character positions into prefix / middle / suffix and laid out as one of:

    PSM  <|fim_prefix|> prefix <|fim_suffix|> suffix <|fim_middle|> middle <eos>
    SPM  <|fim_prefix|> <|fim_suffix|> suffix <|fim_middle|> prefix middle <eos>

SPM (probability `spm_rate` among FIM documents) is the paper's SPM variant: the prefix moves after
<|fim_middle|> so that prefix + middle is one continuous text the model writes. Prefix, middle and
suffix are tokenized separately, so a piece never straddles a cut, the middle and suffix as continuations
(Tokenizer.encode_pieces: no start-of-text space, so the ids of prefix + middle + suffix decode to the
document); the three FIM symbols are control tokens that no literal text encodes to. The draw depends on
the document only, so a document the mixture repeats is repeated with the same arrangement.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from kiln.tokens.mixture import hash_unit

PSM, SPM = "psm", "spm"


@dataclass(frozen=True)
class FimIds:
    prefix: int
    suffix: int
    middle: int
    eos: int


@dataclass(frozen=True)
class FimSplit:
    mode: str  # "psm" | "spm"
    prefix: str
    middle: str
    suffix: str


def fim_split(text: str, doc_id: str, seed: int, rate: float, spm_rate: float) -> FimSplit | None:
    """The FIM cut of a document, or None when it stays plain. Deterministic in (doc_id, seed)."""
    if not text or rate <= 0:
        return None
    rng = random.Random(hash_unit("fim", seed, doc_id))
    if rng.random() >= rate:
        return None
    a, b = sorted((rng.randint(0, len(text)), rng.randint(0, len(text))))
    mode = SPM if rng.random() < spm_rate else PSM
    return FimSplit(mode, text[:a], text[a:b], text[b:])


def fim_tokens(split: FimSplit, prefix: list[int], middle: list[int], suffix: list[int], ids: FimIds) -> list[int]:
    """The token layout of a FIM document (EOS included), from the separately encoded pieces."""
    if split.mode == PSM:
        return [ids.prefix, *prefix, ids.suffix, *suffix, ids.middle, *middle, ids.eos]
    return [ids.prefix, ids.suffix, *suffix, ids.middle, *prefix, *middle, ids.eos]


def unfim(tokens: list[int], ids: FimIds) -> tuple[str, list[int], list[int], list[int]]:
    """(mode, prefix, middle, suffix) token lists of a FIM document: the inverse of `fim_tokens` (for
    checks and examples; an SPM document's prefix/middle boundary is not recoverable, so its prefix and
    middle come back joined, as `middle`)."""
    body = list(tokens[:-1] if tokens and tokens[-1] == ids.eos else tokens)
    if body[:2] == [ids.prefix, ids.suffix]:
        m = body.index(ids.middle)
        return SPM, [], body[m + 1:], body[2:m]
    if not body or body[0] != ids.prefix:
        raise ValueError("not a FIM document: it does not start with <|fim_prefix|>")
    s, m = body.index(ids.suffix), body.index(ids.middle)
    return PSM, body[1:s], body[m + 1:], body[s + 1:m]
