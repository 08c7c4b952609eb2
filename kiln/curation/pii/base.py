"""The PII types, their placeholders, and what every detector module shares: the number-boundary patterns and
the check of a `types` argument."""

from __future__ import annotations

from collections.abc import Iterable

PII_TYPES: tuple[str, ...] = ("email", "phone", "ipv4", "ipv6", "us_ssn", "credit_card", "iban", "secret")
PLACEHOLDERS: dict[str, str] = {t: f"<{t.upper()}>" for t in PII_TYPES}


# Speed: Python's `re` jumps quickly to candidate positions only when a pattern starts with a literal
# or a character class; a leading look-behind means a full match attempt at every position (~8x
# slower over a whole corpus). So patterns consume their first character and then look behind it.
#
# Number boundaries: a match never starts or ends inside a longer token. `\w` stops "x555-123-4567"
# and a card inside a longer digit run; a digit joined by '.' or '-' stops the middle of
# "12-555-123-4567" or "555-123-4567-89" (order and part numbers).
_LEAD = r"[0-9](?<!\w[0-9])(?<![0-9][.-][0-9])"  # first digit of a number that starts a token
_NUM_R = r"(?!\w)(?![.-][0-9])"


def _check_types(types: Iterable[str]) -> tuple[str, ...]:
    wanted = (types,) if isinstance(types, str) else tuple(types)
    bad = [t for t in wanted if t not in PII_TYPES]
    if bad:
        raise ValueError(f"unknown PII type(s) {bad}; allowed: {', '.join(PII_TYPES)}")
    return wanted
