"""Secrets known by their shape or their name, as patterns: the part of ``kvstudy.redact`` that the
atomic writers below it use (``io.write_csv`` scrubs every CSV with :func:`redact_shapes`), so it
imports nothing of the project. ``kvstudy.redact`` builds everything else on it.
"""

from __future__ import annotations

import re

REDACTED = "[REDACTED]"
SECRET_NAME = re.compile(
    r"TOKEN|KEY|SECRET|PASSWORD|PASSWD|PASSPHRASE|PWD|CREDENTIAL|AUTH|COOKIE|PRIVATE|SESSION|CERT|SIGNATURE", re.I
)
# Names that match SECRET_NAME but hold nothing secret (a count of tokens is not a token).
_HARMLESS_NAME = re.compile(
    r"TOKENS|TOKENIZER|TOKEN_?IDS?$|TOKEN_?(?:LEN|COUNT)|KEY_?VALUE|KEY_?HEADS|KEY_?DIM|"
    r"SORT_?KEY|AUTHOR(?!I)|KV_?CACHE|^SESSIONS$",
    re.I,
)  # "sessions": a manifest's list of runs
# A token's shape, also inside a longer name: after any character but a letter or digit, so
# ``models/hf_...-model`` and ``run_hf_...`` are caught (``xhf_...`` is another word).
TOKEN_VALUE = re.compile(
    r"(?<![A-Za-z0-9])(?:hf_[A-Za-z0-9]{8,}|sk-[A-Za-z0-9_\-]{8,}|sk_(?:live|test)_[A-Za-z0-9]{8,}|gh[pousr]_[A-Za-z0-9]{8,}|"
    r"github_pat_[A-Za-z0-9_]{8,}|xox[abpr]-[A-Za-z0-9\-]{8,}|(?:AKIA|ASIA)[A-Z0-9]{12,}|"
    r"glpat-[A-Za-z0-9_\-]{8,}|eyJ[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]+)"
)
# After ``_`` a plain lowercase word (``use_hf_transfer``) is a name, not a token.
_PLAIN_WORD = re.compile(r"[a-z_\-]{1,15}")
# A value that is a token by its prefix: ``safe_environment`` drops the whole variable.
SECRET_VALUE = re.compile(r"^(hf_|sk-|ghp_|gho_|github_pat_|xox[abp]-|AKIA)[A-Za-z0-9_\-]{8,}")
# ``scheme://user:password@host``: the password runs to the authority's last ``@`` (an unencoded
# ``@`` inside it is common), wherever the URL sits in a longer text or a longer URL.
URL_PASSWORD = re.compile(
    r"(?P<head>\b[A-Za-z][A-Za-z0-9+.\-]*://[^\s:/@'\"]*:)(?P<pw>[^\s/?#'\"]+)(?=@[^\s@/?#'\"]*(?:[/?#\s'\")\]]|$))"
)
# ``?password=...`` / ``&token=...`` in a URL's query: the value runs to the next ``&``.
QUERY_SECRET = re.compile(r"(?P<head>[?&;](?P<name>[A-Za-z_][A-Za-z0-9_\-.]*)=)(?P<value>[^&#\s'\"]+)")
AUTH_HEADER = re.compile(
    r"(?P<head>\b(?:Proxy-)?Authorization\s*[:=]\s*(?:(?:Bearer|Basic|Token)\s+)?)"
    r"(?P<value>[^\s'\",]+)",
    re.I,
)


def is_secret_name(name: str) -> bool:
    """Whether a variable, field or option name (any spelling) names a secret."""
    bare = str(name).lstrip("-").replace("-", "_")
    return bool(SECRET_NAME.search(bare)) and not _HARMLESS_NAME.search(bare)


def _token(match: re.Match[str]) -> str:
    """A token-shaped match redacted, unless it follows ``_`` and its body is a plain word."""
    start = match.start()
    if start and match.string[start - 1] == "_":
        body = re.sub(r"^(?:hf_|sk-|sk_(?:live|test)_|gh[pousr]_|github_pat_|xox[abpr]-|glpat-)", "", match.group(0))
        if _PLAIN_WORD.fullmatch(body):
            return match.group(0)
    return REDACTED


def redact_shapes(text: str) -> str:
    """``text`` with the secrets known by their shape replaced: URL passwords (also inside a longer
    URL), secret query parameters, Authorization headers and token-shaped strings (also inside a
    folder name). Report text (code, tables, style sheets) gets this, not the ``NAME=value`` rule,
    which would take ``key=lambda ...`` or ``--jp-private-height: 28px`` for secrets."""
    text = URL_PASSWORD.sub(lambda m: m.group("head") + REDACTED, text)
    text = QUERY_SECRET.sub(
        lambda m: m.group("head") + REDACTED if is_secret_name(m.group("name")) else m.group(0), text
    )
    text = AUTH_HEADER.sub(lambda m: m.group("head") + REDACTED, text)
    return TOKEN_VALUE.sub(_token, text)
