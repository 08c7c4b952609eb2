"""PII redaction: personal data and secrets become typed placeholders (`find_pii`, `redact`, the `pii` step).
Detectors by kind in `contact` (e-mail, phone), `network` (IPv4/IPv6), `financial` (IBAN, SSN, cards) and `secrets`;
`redaction` screens, combines and replaces them. The residual_pii check's own detector: `kiln.curation.residual_pii`."""

from kiln.curation.pii.base import PII_TYPES, PLACEHOLDERS
from kiln.curation.pii.financial import IBAN_LENGTHS, iban_ok
from kiln.curation.pii.network import DOCUMENTATION_NETWORKS
from kiln.curation.pii.redaction import PiiMatch, PiiRedaction, find_pii, redact

__all__ = ["DOCUMENTATION_NETWORKS", "IBAN_LENGTHS", "PII_TYPES", "PLACEHOLDERS", "PiiMatch", "PiiRedaction", "find_pii",
           "iban_ok", "redact"]
