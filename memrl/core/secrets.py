"""The secret values of this process, and `redact(text)`, which hides them in whatever is shown or written.

A value is secret when it is set in a variable or recipe field whose name says so (a key, token, password, secret
or credential: `OPENAI_API_KEY`, `api_key`, `hfToken`), or when it fills a `${NAME}` reference in a field that says
so, whatever the variable is called. `memrl.core.envrefs` registers what recipes and commands fill in; secret-named
environment variables and secret-named flags of this process's command line (`--api-key VALUE`) are read at each
call, so a key exported later is hidden too. A URL's credentials are secrets wherever the URL comes from (a recipe,
a flag, a `${NAME}`): its userinfo, and query values whose key says so (`?api_key=...`). Masking goes by value, so a
key inside a URL, a JSON blob or an error message is hidden wherever it lands.
"""

from __future__ import annotations

import io
import itertools
import json
import logging
import os
import re
import sys
import threading
import urllib.parse
from collections.abc import Callable, Iterable, Mapping, Sequence
from functools import lru_cache
from typing import IO, Any

MASK = "***"
# Words that mark a name as secret. Whole words only: `max_tokens`, `TOKENIZERS_PARALLELISM` and `RAY_AUTH_MODE`
# must not turn their values (256, "false", "disabled") into secrets.
# Not "pwd": $PWD (and OLDPWD) hold the current folder, which would turn every path into "***".
SECRET_WORDS = frozenset(
    {"key", "apikey", "token", "password", "passwd", "secret", "credential", "credentials", "cred", "creds"}
)
# Shorter values are placeholders ("EMPTY", "none", "dummy"), not keys: masking them would garble ordinary text.
MIN_SECRET_LEN = 8
_WORD = re.compile(r"[A-Z]?[a-z]+|[A-Z]+(?![a-z])|[0-9]+")
# What follows a URL's scheme, to the first space or quote: a URL inside any text (a flag's value, an override
# `models.judge.endpoint=http://...`, an error message) is a scheme and this.
_AFTER_SCHEME = re.compile(r"://[^\s'\"<>]+")
_SCHEME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789+.-")


def urls(text: str) -> list[str]:
    """Every URL in `text` (`scheme://...`), left to right, none inside another. Found from each "://" back to the
    start of its scheme: a pattern that tried every starting letter would scan the text once per letter (seconds on
    a 40 KB value, most of a minute on 120 KB)."""
    found: list[str] = []
    end = 0
    for match in _AFTER_SCHEME.finditer(text):
        if match.start() < end:  # inside the URL found before (`http://a.b://c`)
            continue
        start = match.start()
        while start > end and text[start - 1] in _SCHEME_CHARS:
            start -= 1
        while start < match.start() and not text[start].isalpha():  # a scheme starts with a letter
            start += 1
        if start < match.start():
            found.append(text[start : match.end()])
            end = match.end()
    return found


_registered: set[str] = set()
_lock = threading.Lock()


@lru_cache(maxsize=4096)
def is_secret_name(name: str) -> bool:
    """Whether a variable or field named `name` holds a secret, by its words (snake_case, camelCase, UPPER_CASE)."""
    return any(word.lower() in SECRET_WORDS for word in _WORD.findall(name))


def register(values: Iterable[str | None]) -> None:
    """Remember `values` as secrets of this process (placeholders shorter than MIN_SECRET_LEN are ignored)."""
    keep = {v for v in values if v and len(v.strip()) >= MIN_SECRET_LEN}
    with _lock:
        _registered.update(keep)


def known(environ: Mapping[str, str] | None = None, argv: Sequence[str] | None = None) -> set[str]:
    """Every secret value of this process: registered ones, those of secret-named environment variables, and those
    on this process's command line: given to a secret-named flag (`--api-key VALUE`, `--hf-token=VALUE`) or inside a
    URL's credentials (`--endpoint http://user:KEY@host/v1`)."""
    env = os.environ if environ is None else environ
    found = {v for k, v in env.items() if is_secret_name(k)} | _argv_secrets(tuple(sys.argv if argv is None else argv))
    with _lock:
        return _registered | {v for v in found if len(v.strip()) >= MIN_SECRET_LEN}


@lru_cache(maxsize=8)
def _argv_secrets(argv: tuple[str, ...]) -> frozenset[str]:
    found = set(url_credentials(" ".join(argv)))
    for flag, following in itertools.pairwise([*argv, ""]):
        name, eq, value = flag.partition("=")
        if name.startswith("--") and is_secret_name(name):
            found.add(value if eq else following)
    return frozenset(found)


def url_credentials(text: str) -> list[str]:
    """The credentials of every URL in `text`, as written and decoded: the password of its userinfo (the user, when
    it has no password: `https://TOKEN@host`) and the values of query keys that name a secret (`?api_key=...`)."""
    found: list[str] = []
    for url in urls(text):
        authority = re.split(r"[/?#]", url.partition("://")[2], maxsplit=1)[0]
        user, _, password = authority.rpartition("@")[0].partition(":")
        if password or user:
            found += {password or user, urllib.parse.unquote(password or user)}
        for pair in url.partition("#")[0].partition("?")[2].split("&"):
            key, eq, value = pair.partition("=")
            if eq and value and is_secret_name(urllib.parse.unquote_plus(key)):
                found += {value, urllib.parse.unquote_plus(value)}
    return found


def redact(text: str, environ: Mapping[str, str] | None = None, argv: Sequence[str] | None = None) -> str:
    """`text` with every known secret value (raw, JSON-escaped or URL-quoted) replaced by MASK."""
    pattern = _pattern(frozenset(known(environ, argv)))
    return text if pattern is None else pattern.sub(MASK, text)


@lru_cache(maxsize=8)
def _pattern(values: frozenset[str]) -> re.Pattern[str] | None:
    forms = {form for v in values for form in (v, json.dumps(v)[1:-1], urllib.parse.quote(v, safe=""))}
    if not forms:
        return None
    # Longest first, so a secret that contains another is masked whole.
    return re.compile("|".join(re.escape(f) for f in sorted(forms, key=len, reverse=True)))


# ---- hooks: logs and consoles --------------------------------------------------------------------------------------


def redact_logs() -> None:
    """Redact every log record of this process as it is made (message and traceback), whichever logger or handler
    it goes to. Idempotent."""
    factory = logging.getLogRecordFactory()
    if getattr(factory, "memrl_redacts", False):
        return

    def make(*args: Any, **kwargs: Any) -> logging.LogRecord:
        record = factory(*args, **kwargs)
        try:
            message = record.getMessage()
        except Exception:  # a malformed record: logging reports it when it is emitted, not here
            return record
        clean = redact(message)
        if clean != message:  # records left alone keep their args (some formatters read them)
            record.msg, record.args = clean, None
        if record.exc_info and not record.exc_text:
            record.exc_text = redact(logging.Formatter().formatException(record.exc_info))
        return record

    make.memrl_redacts = True  # type: ignore[attr-defined]
    logging.setLogRecordFactory(make)


class RedactingStream(io.TextIOBase):
    """A text stream that redacts what it writes before passing it on to `target`, a stream or a function that
    returns the stream to use at each write (for a console that follows whatever sys.stdout is)."""

    def __init__(self, target: IO[str] | Callable[[], IO[str]]) -> None:
        super().__init__()
        self.target = target

    @property
    def out(self) -> IO[str]:
        return self.target() if callable(self.target) else self.target

    def write(self, text: str) -> int:
        self.out.write(redact(text))
        return len(text)

    def flush(self) -> None:
        self.out.flush()

    def isatty(self) -> bool:
        return self.out.isatty()

    def fileno(self) -> int:
        return self.out.fileno()

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return getattr(self.out, "encoding", None) or "utf-8"
