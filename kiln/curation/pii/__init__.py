"""PII redaction: personal data and secrets become typed placeholders (`find_pii`, `redact`, the `pii` step).
Detectors by kind in `contact` (e-mail, phone), `network` (IPv4/IPv6), `financial` (IBAN, SSN, cards) and `secrets`;
`redaction` screens, combines and replaces them. The residual_pii check's own detector: `kiln.curation.residual_pii`."""

from kiln.curation.pii.base import PII_TYPES, PLACEHOLDERS
from kiln.curation.pii.contact import DEFAULT_PHONE_REGIONS
from kiln.curation.pii.financial import IBAN_LENGTHS, iban_ok
from kiln.curation.pii.network import DEFAULT_IPV4_KEEP, DOCUMENTATION_NETWORKS
from kiln.curation.pii.redaction import (
                                         PHONE_CUE_SCREEN,
                                         PHONE_NATIONAL_SCREEN,
                                         PHONE_TRUNK_SCREEN,
                                         SCREENS,
                                         SECRET_TOKEN_SCREEN,
                                         PiiMatch,
                                         PiiRedaction,
                                         find_pii,
                                         redact,
                                         screen,
)

__all__ = [
    "DEFAULT_IPV4_KEEP", "DEFAULT_PHONE_REGIONS", "DOCUMENTATION_NETWORKS", "IBAN_LENGTHS", "PHONE_CUE_SCREEN",
    "PHONE_NATIONAL_SCREEN", "PHONE_TRUNK_SCREEN", "PII_TYPES", "PLACEHOLDERS", "SCREENS", "SECRET_TOKEN_SCREEN",
    "PiiMatch", "PiiRedaction", "find_pii", "iban_ok", "redact", "screen",
]
