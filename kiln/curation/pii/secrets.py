"""Secrets: private-key blocks, provider tokens (AWS, GitHub, Slack, Stripe, ...), passwords in URLs and
Authorization headers, and random-looking values assigned to credential-named keys."""

from __future__ import annotations

import base64
import math
import re
from collections import Counter
from collections.abc import Iterator

# --- secret -------------------------------------------------------------------------------------
# Credentials with a recognisable shape are redacted wherever they occur; a generic
# `api_key = "..."` assignment only when the value is long and random-looking (a password's value also when it is
# short: _password_ok), and then only the value (the key name is harmless and keeps code readable).

# PEM private keys: BEGIN line, optional RFC 1421 headers (Proc-Type, DEK-Info), base64 lines, END
# line, replaced whole. Lines may be broken by real newlines or by "\n" escapes (keys pasted into
# string literals). At least one base64 line is required, so code and docs that only name the
# markers stay. A block cut off before its END line (truncated documents) loses what it has.
_PEM_NL = r"(?:(?:\r?\n|(?:\\r)?\\n)[ \t]*)+"
_PEM = re.compile(
    r"-----BEGIN ((?:[A-Z0-9]+ )*PRIVATE KEY(?: BLOCK)?)-----[ \t]*"
    r"(?:" + _PEM_NL + r"[A-Za-z-]+:[^\r\n\\]*)*"
    r"(?:" + _PEM_NL + r"[A-Za-z0-9+/=]+[ \t]*)+"
    r"(?:" + _PEM_NL + r"-----END \1-----)?"
)
# AWS access key ids (long-term AKIA, temporary ASIA).
_AWS_KEY_ID = re.compile(r"A(?<![A-Za-z0-9]A)(?:KIA|SIA)[A-Z0-9]{16}(?![A-Za-z0-9])")
# GitHub (classic ghp_/gho_/ghu_/ghs_/ghr_, fine-grained github_pat_) and Slack tokens. Slack ones must
# contain a digit so documentation placeholders like "xoxb-your-token-here" stay.
_GITHUB_PREFIXES = ("ghp_", "gho_", "ghu_", "ghs_", "ghr_", "github_pat_")
_GITHUB_TOKEN = re.compile(
    r"(?:gh[pousr]_(?<![A-Za-z0-9_]gh._)[A-Za-z0-9]{36,251}"
    r"|github_pat_(?<![A-Za-z0-9_]github_pat_)[A-Za-z0-9_]{22,251})(?![A-Za-z0-9_-])"
)
_SLACK_TOKEN = re.compile(
    r"xox[abpr]-(?<![A-Za-z0-9_]xox.-)(?=[A-Za-z-]{0,250}[0-9])[A-Za-z0-9-]{10,250}(?![A-Za-z0-9_-])"
)
# Assignments `key = "value"`, `"key": "value"`, `key => 'value'`, and unquoted `KEY=value` lines as in
# .env, YAML or INI files and URL queries (`?token=...&`). Unquoted values must end the line (or the
# query parameter, or come before the line's next `name=`) so code like `token = self.get_token(...)` or
# `key: SomeTypeName,` stays. The key
# name must END in a credential word, in any case and with any prefix (dbPassword, GITHUB_TOKEN,
# client_secret, SECRET_KEY, aws_secret_access_key): "tokenizer_name" and "password_hint" are not.
# Keywords are found in an ASCII-lowercased copy (a case-insensitive alternation would be tried at
# every position), the rest is matched on the original text right after each keyword.
_SECRET_KEYWORD = re.compile(r"key|secret|token|passw(?:or)?d|pass(?:phrase)?|pwd|credentials?")  # a fast scan
# Of "...key": the words that make a key a credential. "account" and "azure_storage" are Azure's names for a storage
# account key (a connection string's AccountKey, AZURE_STORAGE_KEY); a bare "storage_key" is as often an object's path.
KEY_QUALIFIERS = r"api|access|private|encryption|signing|master|session|license|account|azure[_-]?storage"
_KEY_QUALIFIER = re.compile(r"(?:" + KEY_QUALIFIERS + r")[_-]?$")
_QUALIFIER_REACH = 16  # characters before "key" that _KEY_QUALIFIER reads
# After the key: `"key": "v"`, `$cfg["key"] = "v"`, `setdefault("KEY", "v")` (a quoted key and a comma), `key = v`.
# An unquoted value runs to the end of its line in .env, YAML and INI files (any symbols: generated
# passwords have them), to the next '&' in a URL query (`?token=...&`) and to the next ';' in a connection
# string (`Server=db;Password=...;Encrypt=True`): which one is decided by what precedes the key.
_ASSIGN_OP = r"(?:[_-]?(?:[Aa][Cc][Cc][Ee][Ss][Ss][_-]?)?[Kk][Ee][Yy]|[Ss])?(?:[\"']\]?\s*(?::=|=>|[:=,])|\]?\s*(?::=|=>|[:=]))\s*"
# A value written as a form body or a query string without its '?' ("client_secret=...&grant_type=client_credentials",
# an OAuth token request at the start of a text or after `curl -d '`) ends where the next `&name=` starts.
_NEXT_PARAM = re.compile(r"&[A-Za-z_][\w.-]*=")
# A line's unquoted value may also end where the next `name=value` of the same line starts (libpq's
# "host=db password=... dbname=app", a log line's "password=... user=bob").
_QUOTED = r"(?P<q>[\"'`])(?P<qv>[^\s\"'`<>]{6,256}+)(?P=q)"  # possessive: never retry shorter values
_NEXT_PAIR = r"|[ \t]+[A-Za-z_][\w.-]*="
_ASSIGNED_VALUE = {
    "line": re.compile(_ASSIGN_OP + r"(?:" + _QUOTED + r"|(?P<v>[^\s\"'`<>]{6,256}+)(?=[ \t]*(?:\r?\n|\Z|\s#)"
                       + _NEXT_PAIR + r"))"),
    "query": re.compile(_ASSIGN_OP + r"(?:" + _QUOTED + r"|(?P<v>[^\s\"'`<>&#]{6,256}+)(?=[ \t]*(?:[\r\n&#]|\Z)))"),
    "dsn": re.compile(_ASSIGN_OP + r"(?:" + _QUOTED + r"|(?P<v>[^\s\"'`<>;]{6,256}+)(?=[ \t]*(?:[\r\n;]|\Z)))"),
}
# Keys whose value is a password, however short: people's passwords are ("hunter2x9", "Tr0ub4dor&3"). Other credential
# names (tokens, API keys) hold long generated values: a short one is more often a name or a stand-in. "pass" counts
# as a whole word ("DB_PASS", "dbPass"), not the end of "bypass" or "compass".
_PASSWORD_WORD = re.compile(r"passw(?:or)?d|pwd|pass(?:phrase)?|secret")
_ATTRIBUTE = re.compile(r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+")  # `self.pw2`
_IDENTIFIER = re.compile(r"[A-Za-z_]\w*")
_KEY_CHARS = frozenset("abcdefghijklmnopqrstuvwxyz0123456789_.-")
_CALL = re.compile(r"[A-Za-z_][\w.]*[(\[]")  # `token = self.get_token(request)`, `tokens[i]`: code, not a value
_TRAILING = ".,;:!?)]}'\""  # punctuation after a value in prose or markup ("?password=...)."), not part of it
# Credentials with a published prefix and alphabet, redacted wherever they occur: (a substring every token holds,
# its pattern). Stripe secret and restricted keys and webhook secrets, Google API keys, GitLab, npm, PyPI,
# Hugging Face, SendGrid, DigitalOcean, Databricks, Shopify, Anthropic and OpenAI tokens, JSON Web Tokens.
_PROVIDER_TOKENS = tuple((gate, re.compile(pattern + r"(?![A-Za-z0-9_-])")) for gate, pattern in (
    ("k_live_", r"[sr]k_live_[0-9A-Za-z]{20,247}"),
    ("whsec_", r"whsec_[0-9A-Za-z+/=]{32,100}"),
    ("AIza", r"AIza[0-9A-Za-z_-]{35}"),
    ("glpat-", r"glpat-[0-9A-Za-z_-]{20,64}"),
    ("npm_", r"npm_[0-9A-Za-z]{36}"),
    ("pypi-", r"pypi-AgEIcHlwaS5vcmc[0-9A-Za-z_-]{16,}"),
    ("hf_", r"hf_[0-9A-Za-z]{34,40}"),
    ("SG.", r"SG\.[0-9A-Za-z_-]{22}\.[0-9A-Za-z_-]{43}"),
    ("_v1_", r"do[opr]_v1_[0-9a-f]{64}"),
    ("dapi", r"dapi[0-9a-f]{32}(?:-[0-9]{1,2})?"),
    ("shp", r"shp(?:at|ca|pa|ss)_[0-9a-fA-F]{32}"),
    ("sk-", r"sk-(?:ant-(?:api|admin)[0-9]{2}-[0-9A-Za-z_-]{80,}|(?:proj|svcacct|admin)-[0-9A-Za-z_-]{40,}"
            r"|[0-9A-Za-z]{20}T3BlbkFJ[0-9A-Za-z]{20})"),
    ("eyJ", r"eyJ[0-9A-Za-z_-]{10,}\.eyJ[0-9A-Za-z_-]{10,}\.[0-9A-Za-z_-]{10,}"),
))
# Slack incoming-webhook URLs: the last component is the secret. HTTP Basic/Bearer credentials after their header.
_SLACK_WEBHOOK = re.compile(r"hooks\.slack\.com/services/T[A-Z0-9]{6,}/B[A-Z0-9]{6,}/([A-Za-z0-9]{20,32})(?![A-Za-z0-9])")
_AUTH_HEADER = re.compile(r"(?i)authorization[\"']?\s*[:=]\s*[\"']?(?:basic|bearer|token)\s+([A-Za-z0-9+/=._~-]{16,})")
# A password in a URL: scheme://user:password@host (user may be empty: redis://:password@host).
_URL_USERINFO = re.compile(r"[^\s:/@?#\"'<>]*:([^\s/@?#\"'<>]{6,256})@[A-Za-z0-9]")
_ASCII_LOWER = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")


def _shannon_bits(s: str) -> float:
    n = len(s)
    return -sum(c / n * math.log2(c / n) for c in Counter(s).values())


_BASE64 = re.compile(r"[A-Za-z0-9+/]+")


def _assigned_secret_ok(v: str, aws: bool, min_length: int = 16) -> bool:
    # Random-looking: letters AND digits, >= 3 bits of entropy per character. Not a URL, a path, an
    # environment/template reference. AWS secret keys (exactly 40 base64 characters) may lack digits.
    if len(v) < min_length or "://" in v or "{{" in v or not any(c.isalpha() for c in v):
        return False
    if v[0] in "/.~$%{<" and not (aws and len(v) == 40 and _BASE64.fullmatch(v)):
        return False  # a path, an environment or template reference (an AWS secret key may start with '/')
    if not (any(c.isdigit() for c in v) or (aws and len(v) == 40)):
        return False
    return _shannon_bits(v) >= 3.0


def _password_ok(v: str, op: str, quoted: bool) -> bool:
    """A value (`op`: what stands between the name and it) assigned to a password name: a password as
    _url_password_ok says (a digit or a symbol, not only punctuation at its end: "string?"; no stand-in), of 6+
    characters. Not a call's argument after a quoted name (`derive_key("secret", "Ed25519")`), and unquoted not code:
    brackets (`password=None):`), an attribute (`self.pw2`), or a name after a spaced '=' (`secret_key = s3_conn`;
    .env, YAML and INI values are written `KEY=value`, `key: value`)."""
    if len(v) < 6 or "," in op or not _url_password_ok(v.rstrip("?!.,:;")):
        return False
    if quoted:
        return True
    return not (any(c in "()[]{}" for c in v) or _ATTRIBUTE.fullmatch(v)
                or (_IDENTIFIER.fullmatch(v) and "=" in op and " " in op))


def _url_password_ok(v: str) -> bool:
    """A password in a URL's userinfo: a credential by where it stands, however short or guessable ("Passw0rd1",
    "hunter22", a camera's "12345678"), unless it is a stand-in: a plain word ("password", "guest"), a template
    or format reference ("${DB_PASSWORD}", "%s", "<password>", "[password]]"), or a mask ("********"). So: a digit
    or a symbol (not a word's '_', '-', '.', nor brackets), and at least three distinct characters."""
    if v[0] in "/.~$%{<*[(" or "{{" in v or len(set(v)) < 3:
        return False
    return any(c.isdigit() or not (c.isalnum() or c in _WORD_OR_BRACKET) for c in v)


_WORD_OR_BRACKET = frozenset("_-.[](){}<>")


def _basic_credentials(value: str) -> bool:
    """HTTP Basic: base64 of "user:password" (random passwords may lack a digit in their base64 form)."""
    try:
        decoded = base64.b64decode(value, validate=True).decode("utf-8")
    except (ValueError, UnicodeDecodeError):
        return False
    return ":" in decoded and decoded.isprintable() and len(decoded.split(":", 1)[1]) >= 8


def _varied(token: str) -> bool:
    """Not a documentation stand-in: "AKIAXXXXXXXXXXXXXXXX", "ghp_xxxx...x" repeat one or two characters."""
    return len(set(token)) >= 8


def _is_password_name(text: str, k: re.Match) -> bool:
    """Whether the credential word `k` (found in the lowercased text) names a password (_PASSWORD_WORD)."""
    if _PASSWORD_WORD.fullmatch(k.group()) is None:
        return False
    return not (k.group().startswith("pass") and k.start() > 0 and text[k.start() - 1].islower()
                and text[k.start()] == "p")  # "bypass", "compass"; "dbPass" and "DB_PASS" are names of one


def _env_file_key(text: str, start: int, end: int) -> bool:
    """An upper-case variable name at the start of a line (`DB_PASSWORD=`, `export SMTP_PASS=`): a .env file, whose
    value runs to the end of its line, '&' and "name=" included. A form body's names are lower case (OAuth's
    `client_secret=...&grant_type=...`)."""
    name_end = end
    while name_end < len(text) and (text[name_end].isalnum() or text[name_end] == "_"):
        name_end += 1  # the rest of the name after its credential word (`API_KEYS`, `SECRET_KEY`)
    line = text[text.rfind("\n", 0, start) + 1 : start].strip()
    return line in ("", "export") and text[start:name_end].isupper()


def _find_secret(text: str, tokens: bool = True) -> Iterator[tuple[int, int]]:
    """Secret spans; `tokens` False: not the provider tokens, webhook URLs, URL passwords and Authorization
    headers (the batch screen says a text has none)."""
    if "PRIVATE KEY" in text:
        for m in _PEM.finditer(text):
            yield m.span()
    for m in _AWS_KEY_ID.finditer(text):
        if _varied(m.group()[4:]):
            yield m.span()
    if any(p in text for p in _GITHUB_PREFIXES):
        for m in _GITHUB_TOKEN.finditer(text):
            if _varied(m.group()[4:]):
                yield m.span()
    if "xox" in text:
        for m in _SLACK_TOKEN.finditer(text):
            yield m.span()
    for gate, pattern in _PROVIDER_TOKENS if tokens else ():
        if gate in text:
            for m in pattern.finditer(text):
                if (m.start() == 0 or not (text[m.start() - 1].isalnum() or text[m.start() - 1] == "_")) and _varied(
                        m.group()):
                    yield m.span()
    if tokens and "hooks.slack.com" in text:
        for m in _SLACK_WEBHOOK.finditer(text):
            yield m.span(1)
    pos = text.find("://") if tokens else -1
    while pos != -1:
        m = _URL_USERINFO.match(text, pos + 3)
        if m is not None and _url_password_ok(m.group(1)):
            yield m.span(1)
        pos = text.find("://", pos + 3)
    lowered = text.lower()
    if len(lowered) != len(text):  # a few non-ASCII characters lowercase to two ("İ")
        lowered = text.translate(_ASCII_LOWER)
    if tokens and "authorization" in lowered:
        for m in _AUTH_HEADER.finditer(text):
            if _assigned_secret_ok(m.group(1), True) or _basic_credentials(m.group(1)):
                yield m.span(1)
    for k in _SECRET_KEYWORD.finditer(lowered):
        if k.group() == "key" and not _KEY_QUALIFIER.search(lowered, max(0, k.start() - _QUALIFIER_REACH), k.start()):
            continue
        key_start = k.start()
        while key_start > 0 and lowered[key_start - 1] in _KEY_CHARS:
            key_start -= 1
        before = text[key_start - 1 : key_start]
        kind = "query" if before in ("?", "&") else "dsn" if before == ";" else "line"
        m = _ASSIGNED_VALUE[kind].match(text, k.end())
        if kind == "line" and "&" in text[k.end() : k.end() + 300] and not _env_file_key(text, key_start, k.end()):
            q = _ASSIGNED_VALUE["query"].match(text, k.end())
            if q is not None and q.group("v") is not None and _NEXT_PARAM.match(text, q.end("v")):
                kind, m = "query", q  # a form body or a query without its '?': "client_secret=...&grant_type=..."
        if m is None:
            continue
        group = "qv" if m.group("qv") is not None else "v"
        value = m.group(group)
        aws = "aws" in lowered[key_start : k.start()]
        start, end = m.span(group)
        if "," in text[k.end() : start] and text[: key_start - 1].rstrip()[-1:] != "(":
            continue  # a quoted name then a comma is a call's argument (`setdefault("API_KEY", "...")`) only after
            # '(': in a list of strings (`['ssh2_auth_password', 'ssh2_auth_pubkey_file']`) the next one is no value
        # Code, not a value: a call (`token = self.get_token(request)`), a line that ends in ',' or an opening
        # bracket (`private_key: PKCS7PrivateKeyTypes,`), or the rest of a call after a keyword argument
        # (`encode(text, add_special_tokens=True)).unsqueeze(0)`).
        if group == "v":
            if _CALL.match(value) is not None or value[-1] in ",;([{" or (
                    value[-1] in ")]" and _CALL.search(value) is not None):
                continue
            while kind == "query" and end > start and text[end - 1] in _TRAILING and (
                    text.count("(", start, end) <= text.count(")", start, end - 1)):
                end -= 1  # "?password=...)." in prose; a .env line's value ends the line, punctuation included
            value = text[start:end]
        if _assigned_secret_ok(value, aws) or (
                _is_password_name(text, k) and _password_ok(value, text[k.end() : m.start(group)], group == "qv")):
            yield start, end
