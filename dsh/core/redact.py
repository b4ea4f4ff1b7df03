"""Keeping dsh's own secrets out of everything it shows or records (MISSION G3).

One function, :func:`redact`, is what every diagnostic passes through on its way to a user or a
file: provider errors (dsh/llm/http/), the reason of a failed turn (``describe_error`` and the
``turn/end`` event), the text of ``step/rejected``, the CLI's error line, ``dsh config show`` and
the ``httpx``/``dsh`` log records. It applies three rules:

1. **Registered secrets** — the API keys, URL credentials and secret header values of the models
   this process built (:func:`register`, :func:`register_url`, :func:`register_headers`, filled
   by :class:`~dsh.llm.http.model.HTTPModel` when a model is built) — are replaced by ``[redacted]``
   in every form a message may carry them: as is, JSON-escaped, ``repr``-escaped (str and bytes),
   URL-encoded (any hex case, ``+`` for spaces), base64'd at any alignment (an echoed
   ``Authorization: Basic …`` header), whitespace-collapsed, and cut short where a message was
   truncated (a start of 4+ characters right before ``…``).
2. **URLs** in the text lose their userinfo (``https://[redacted]@host``) and the values of
   credential-like query parameters (``?api-key=[redacted]``): :func:`redact_url`.
3. **Well-known credential shapes** (``sk-…``, ``ghp_…``, ``AKIA…``, ``Bearer <token>``, private
   key blocks, …) are replaced whoever they belong to.

Only values that can be secrets are registered (:func:`is_secret`): 8 characters or more, not a
well-known placeholder (``x``, ``none``, ``EMPTY``, ``ollama``, ``lm-studio``,
``sk-no-key-required``, …). Local servers are used with such dummy keys, and replacing every
``x`` of a message made it unreadable. A registered secret that contains a digit or a symbol —
every real API key — is redacted wherever it occurs, also glued to other text (an echoed
``Bearer%20KEY`` must not survive); a secret that could be a word (letters only, shorter than
20, one case: ``internal``) is redacted only where it stands as a whole word, so it cannot
mangle longer words that contain it (:func:`is_wordlike`).

Cheap to import: no httpx, no logging; patterns are compiled on first use.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Iterable
from collections.abc import Mapping
from functools import lru_cache
from typing import Any
from typing import cast
from urllib.parse import quote
from urllib.parse import quote_plus
from urllib.parse import unquote
from urllib.parse import unquote_plus

REDACTED = "[redacted]"
#: Shorter values are never treated as secrets (dummy keys of local servers).
MIN_SECRET_LENGTH = 8
#: Placeholder keys that local servers accept and docs suggest: never secrets (compared
#: case-insensitively, surrounding whitespace ignored).
DUMMY_KEYS = frozenset({
    "x", "xx", "xxx", "-", "na", "n/a", "none", "null", "nil", "empty", "dummy", "fake",
    "test", "testing", "key", "apikey", "api-key", "api_key", "token", "secret", "password",
    "changeme", "placeholder", "unused", "anything", "whatever", "local", "localhost",
    "ollama", "lm-studio", "lmstudio", "llama", "llama.cpp", "llamacpp", "llamafile", "vllm",
    "jan", "koboldcpp", "tabbyapi", "no-key", "nokey", "no_key", "no-key-required",
    "not-needed", "not_needed", "notneeded", "not-required", "sk-no-key-required",
    "sk-dummy", "sk-fake", "sk-test", "sk-local", "sk-xxx", "sk-1234", "sk-none",
    "dummy-key", "fake-key", "test-key", "local-key",
})
#: A letters-only secret shorter than this may be a word: redacted only as a whole word.
_WORDLIKE_BELOW = 20
#: A start of a secret at least this long, right before a cut (``…``), is redacted.
_MIN_CUT = 4

#: Name parts (split on ``_ - .``) that make a setting, header or query parameter secret.
_SECRET_PARTS = frozenset({
    "key", "apikey", "token", "secret", "password", "passwd", "pwd", "pass", "passphrase",
    "sig", "signature", "credential", "credentials", "auth", "authorization", "cookie",
    "jwt", "bearer", "dsn",
})
#: Whole names that are secret as query parameters (Azure Functions' ``?code=``).
_SECRET_NAMES = frozenset({"code"})
#: Substrings that make a name secret even without separators (``xapikey``, ``dbpassword``).
_SECRET_SUBSTRINGS = ("apikey", "api_key", "secret", "password", "passwd", "accesstoken",
                      "authtoken", "privatekey", "private_key")
#: A last part that says the value *names* or *locates* a secret rather than holding it.
_NOT_VALUE_SUFFIXES = frozenset({"env", "file", "path", "dir", "name", "var", "variable",
                                 "url", "header", "type", "id", "source", "command", "cmd"})


def is_secret(value: str | None) -> bool:
    """Whether ``value`` is treated as a secret: 8 characters or more (whitespace not
    counted), not a known placeholder, not one character repeated."""
    if not value:
        return False
    stripped = value.strip()
    return (
        len("".join(stripped.split())) >= MIN_SECRET_LENGTH
        and stripped.casefold() not in DUMMY_KEYS
        and len(set(stripped)) > 1
    )


def credential_name(name: str) -> bool:
    """Whether a setting, header or query parameter called ``name`` holds a credential
    (``api_key``, ``x-api-key``, ``Authorization``, ``access_token``, ``X-Amz-Signature``…),
    and not just the name of one (``api_key_env``)."""
    norm = re.sub(r"[-.\s]+", "_", name.strip().casefold())
    parts = [p for p in norm.split("_") if p]
    if not parts or parts[-1] in _NOT_VALUE_SUFFIXES:
        return False
    if norm in _SECRET_NAMES or any(p in _SECRET_PARTS for p in parts):
        return True
    return any(s in norm for s in _SECRET_SUBSTRINGS)


class _LazyPattern:
    """A pattern compiled on first use: ``dsh run`` imports this module on every run and most
    runs redact nothing (compiling these took about 1 ms of every start-up)."""

    __slots__ = ("_args", "_pattern")

    def __init__(self, pattern: str) -> None:
        self._args = pattern
        self._pattern: re.Pattern[str] | None = None

    def __getattr__(self, name: str) -> Any:
        if self._pattern is None:
            self._pattern = re.compile(self._args)
        return getattr(self._pattern, name)


def _lazy(pattern: str) -> re.Pattern[str]:
    return cast("re.Pattern[str]", _LazyPattern(pattern))


_AUTH_SCHEME = _lazy(r"(?i)^\s*(bearer|basic|token|digest|apikey|key|sharedkey)\s+(\S.*)$")


def secret_header(name: str, value: str) -> bool:
    """Whether a custom header carries a credential: by its name (``Authorization``,
    ``x-api-key``, ``Cookie``…) or by its value (``Bearer …``, ``Basic …``, a known key shape)."""
    if credential_name(name) or _AUTH_SCHEME.match(value):
        return True
    return _redact_shapes(value) != value


# -- the forms a secret takes in a message ------------------------------------------------------


def _quote_variants(text: str) -> set[str]:
    """``text`` (a repr body) with its single quotes escaped and unescaped: the delimiter a
    repr picks depends on the whole string around the secret, not on the secret."""
    bare = text.replace("\\'", "'")
    return {text, bare, bare.replace("'", "\\'")}


def _text_escapes(s: str) -> set[str]:
    out = {s, json.dumps(s)[1:-1], json.dumps(s, ensure_ascii=False)[1:-1],
           s.replace("/", "\\/")}  # JSON as PHP and others write it
    out |= _quote_variants(repr(s)[1:-1]) | _quote_variants(ascii(s)[1:-1])
    try:
        raw = s.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:
        raw = s.encode("utf-8", "backslashreplace")
    out |= _quote_variants(repr(raw)[2:-1])
    if any(c.isspace() for c in s):
        out.add(" ".join(s.split()))  # as dsh's truncate() and many loggers collapse it
    return out


def _url_encodings(s: str) -> set[str]:
    out: set[str] = set()
    for fn, safe in ((quote, ""), (quote, "/"), (quote_plus, "")):
        try:
            enc = fn(s, safe=safe, errors="surrogateescape")
        except UnicodeError:
            continue
        out.add(enc)
        out.add(re.sub(r"%[0-9A-F]{2}", lambda m: m.group().lower(), enc))
    return out


def _base64_cores(s: str) -> set[str]:
    """The part of base64(``...s...``) that depends on ``s`` alone, for each of the three
    alignments ``s`` can have in the encoded stream (standard and URL-safe alphabets)."""
    import base64

    try:
        raw = s.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:
        return set()
    cores = set()
    for offset, skip in ((0, 0), (1, 2), (2, 3)):
        # whole groups only: the last, partial one depends on what follows
        n = len(raw) - (offset + len(raw)) % 3
        if n <= 0:
            continue
        core = base64.b64encode(b"\0" * offset + raw[:n]).decode("ascii")[skip:]
        if len(core) >= MIN_SECRET_LENGTH:
            cores |= {core, core.replace("+", "-").replace("/", "_")}
    return cores


def forms_of(secret: str) -> set[str]:
    """Every string under which ``secret`` may appear in a message."""
    once = _text_escapes(secret)
    forms = set(once)
    for f in once:
        forms |= _text_escapes(f)  # escaped twice: a JSON body inside a repr, …
        forms |= _url_encodings(f)
    forms |= _base64_cores(secret)
    return {f for f in forms if len(f) >= min(MIN_SECRET_LENGTH, len(secret))}


def is_wordlike(secret: str) -> bool:
    """Whether ``secret`` could be a word (``internal``, ``Internal``, ``NOTNEEDED``): letters
    only, shorter than 20, one case (or capitalised). Such a secret is redacted only where it
    stands as a whole word; any other is redacted wherever it occurs."""
    return (secret.isalpha() and len(secret) < _WORDLIKE_BELOW
            and (secret.islower() or secret.isupper() or secret[1:].islower()))


# -- well-known shapes and URLs -------------------------------------------------------------------


@lru_cache(maxsize=1)
def _patterns() -> tuple[tuple[re.Pattern[str], str, tuple[str, ...]], ...]:
    """Credential shapes redacted whoever they belong to: ``(pattern, replacement,
    triggers)``; a pattern runs only on text holding one of its triggers (compared in lower
    case), so a long text without any costs a few substring scans."""
    return tuple((re.compile(p), r, t) for p, r, t in (
        (r"(?s)-----BEGIN [A-Z0-9 ]*PRIVATE KEY-----.*?(?:-----END [A-Z0-9 ]*PRIVATE KEY-----|\Z)",
         REDACTED, ("private key",)),
        # OpenAI, Anthropic, OpenRouter…
        (r"(?<![A-Za-z0-9])sk-[A-Za-z0-9_-]{20,}", REDACTED, ("sk-",)),
        (r"(?<![A-Za-z0-9])(?:gh[pousr]_[A-Za-z0-9]{30,}|github_pat_[A-Za-z0-9_]{22,})",
         REDACTED, ("ghp_", "gho_", "ghu_", "ghs_", "ghr_", "github_pat_")),
        (r"(?<![A-Za-z0-9])glpat-[A-Za-z0-9_-]{20,}", REDACTED, ("glpat-",)),
        (r"(?<![A-Za-z0-9])hf_[A-Za-z0-9]{30,}", REDACTED, ("hf_",)),
        (r"(?<![A-Za-z0-9])(?:AKIA|ASIA)[0-9A-Z]{16}(?![A-Za-z0-9])", REDACTED,
         ("akia", "asia")),
        (r"(?<![A-Za-z0-9])AIza[0-9A-Za-z_-]{35}", REDACTED, ("aiza",)),
        (r"(?<![A-Za-z0-9])xox[abposr]-[A-Za-z0-9-]{10,}", REDACTED, ("xox",)),
        # an Authorization header quoted in a message, whatever its token looks like
        (r"(?i)(authorization[\"']?\s*[:=]\s*[\"']?(?:bearer|basic|token)\s+)[^\s\"',;]+",
         rf"\1{REDACTED}", ("authorization",)),
        # a token after an auth scheme: it has a digit, so it is not a word of prose
        (r"(?i)\b(bearer|basic|token)(\s+|%20|\+)(?=[A-Za-z0-9._~+/=-]*[0-9])"
         r"[A-Za-z0-9._~+/=-]{12,}", rf"\1\2{REDACTED}", ("bearer", "basic", "token")),
    ))


@lru_cache(maxsize=1)
def _any_trigger() -> re.Pattern[str]:
    """One search for every pattern's triggers: most texts hold none, and one regex scan is
    much cheaper than a substring scan per trigger (``dsh sessions export --html`` redacts
    every text of a session)."""
    return re.compile("|".join(re.escape(t) for _, _, ts in _patterns() for t in ts))


def _redact_shapes(text: str) -> str:
    lower = text.lower()
    if _any_trigger().search(lower) is None:
        return text
    for pattern, replacement, triggers in _patterns():
        if any(t in lower for t in triggers):
            text = pattern.sub(replacement, text)
    return text


#: The userinfo of a bare URL (``register_url``).
_USERINFO = _lazy(r"^([A-Za-z][A-Za-z0-9+.-]*://)([^/?#]*)@")
#: A userinfo anywhere in text: after ``://``, up to the last ``@`` before the path.
_USERINFO_IN_TEXT = _lazy(r"://[^/?#\s<>\"'`]*@")
#: A query or fragment parameter anywhere in text: ``?name=value``, ``&name=value``…
_PARAM = _lazy(r"([?&;#])([^=&;#?\s<>\"'`]+)=([^&;#\s<>\"'`]+)")


def _param(m: re.Match[str]) -> str:
    sep, name, value = m.groups()
    core = value
    # punctuation after a URL in prose is not part of it (but "[redacted]" stays whole)
    while core and core[-1] in ".,;:!?)]}" and not core.endswith(REDACTED):
        core = core[:-1]
    if not core or core == REDACTED or not credential_name(unquote_plus(name)):
        return m.group()
    return f"{sep}{name}={REDACTED}{value[len(core):]}"


def redact_url(url: str) -> str:
    """``url`` (or any text holding URLs) without userinfo (``user:pass@`` → ``[redacted]@``)
    and with the values of credential-like query and fragment parameters replaced
    (``?api-key=[redacted]``). The rest is kept as written; a second pass changes nothing."""
    if "://" in url:
        url = _USERINFO_IN_TEXT.sub(f"://{REDACTED}@", url)
    if "=" in url:
        url = _PARAM.sub(_param, url)
    return url


# -- the registry ---------------------------------------------------------------------------------


class Redactor:
    """A set of secrets and the compiled matcher for them. :data:`default` is the process's
    registry; the module-level functions use it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._secrets: set[str] = set()
        # (matcher or None, forms that may be cut short before a "…"), swapped as one
        self._state: tuple[_Matcher | None, tuple[str, ...]] = (None, ())

    @property
    def secrets(self) -> frozenset[str]:
        return frozenset(self._secrets)

    def register(self, value: str | None) -> bool:
        """Treat ``value`` as a secret from now on; ``False`` (and nothing registered) when it
        cannot be one (:func:`is_secret`)."""
        if value is None or not is_secret(value):
            return False
        values = {value, value.strip()}
        with self._lock:
            if values <= self._secrets:
                return True
            self._secrets |= values
            self._state = _compile(self._secrets)
        return True

    def register_url(self, url: str) -> None:
        """Register the credentials a URL carries: its userinfo (user, password, and
        ``user:password`` as Basic auth encodes it) and credential-like query values."""
        m = _USERINFO.match(url)
        if m:
            userinfo = m.group(2)
            user, _, password = userinfo.partition(":")
            for v in (userinfo, user, password, unquote(userinfo),
                      f"{unquote(user)}:{unquote(password)}", unquote(user), unquote(password)):
                self.register(v)
        head = url.partition("#")[0]
        for pair in re.split(r"[&;]", head.partition("?")[2]):
            name, eq, value = pair.partition("=")
            if eq and credential_name(unquote_plus(name)):
                self.register(value)
                self.register(unquote_plus(value))

    def register_headers(self, headers: Mapping[str, str]) -> None:
        """Register the values of headers that carry credentials (:func:`secret_header`),
        and the credential inside ``Bearer …`` / ``Basic …`` (decoded) values."""
        for name, value in headers.items():
            if not secret_header(name, value):
                continue
            self.register(value)
            m = _AUTH_SCHEME.match(value)
            if m:
                token = m.group(2).strip()
                self.register(token)
                if m.group(1).lower() == "basic":
                    import base64

                    try:
                        decoded = base64.b64decode(token, validate=True).decode("utf-8")
                    except (ValueError, UnicodeDecodeError):
                        continue
                    self.register(decoded)
                    self.register(decoded.partition(":")[2])

    def redact(self, text: str) -> str:
        """``text`` with every registered secret, URL credential and well-known credential
        shape replaced by ``[redacted]`` (see the module's docstring)."""
        if not text:  # a turn that completed has no reason: no pattern compiled for it
            return text
        return _redact_shapes(redact_url(self.redact_registered(text)))

    def redact_registered(self, text: str) -> str:
        """``text`` with only this redactor's registered secrets replaced (in every form),
        URLs and credential shapes left alone: for a tool's own output, where an example
        ``Bearer …`` is content (dsh-mcp redacts its servers' env/header values this way)."""
        matcher, cuttable = self._state
        if matcher is not None:
            text = matcher.sub(REDACTED, text)
            if "…" in text:
                text = _redact_cuts(text, cuttable)
        return text


def _compile(secrets: Iterable[str]) -> tuple[_Matcher | None, tuple[str, ...]]:
    plain: set[str] = set()
    words: set[str] = set()
    for s in secrets:
        forms = forms_of(s)
        if is_wordlike(s):
            words.add(s)
            forms.discard(s)
        plain |= forms
    if not plain and not words:
        return None, ()
    cuttable = tuple(sorted(plain | words, key=len, reverse=True))
    return _Matcher(cuttable, frozenset(words)), cuttable


class _Matcher:
    """Replaces the forms of the registered secrets. The forms present are found first by
    substring search (fast, in C), so a long text with no secret costs a few scans, and the
    regex (an alternation, tried at every position) runs only over the forms that are there."""

    def __init__(self, forms: tuple[str, ...], words: frozenset[str]) -> None:
        self.forms = forms  # longest first
        self.words = words

    def sub(self, replacement: str, text: str) -> str:
        hits = tuple(f for f in self.forms if f in text)
        return _alternation(hits, self.words).sub(replacement, text) if hits else text


@lru_cache(maxsize=256)
def _alternation(forms: tuple[str, ...], words: frozenset[str]) -> re.Pattern[str]:
    """One regex for ``forms`` (longest first); a word-like secret only as a whole word."""
    return re.compile("|".join(
        rf"(?<![^\W\d_]){re.escape(f)}(?![^\W\d_])" if f in words else re.escape(f)
        for f in forms))


def _redact_cuts(text: str, forms: tuple[str, ...]) -> str:
    """Redact a start of a secret (``_MIN_CUT`` characters or more) that ends where the text
    was cut short (``…``): the longest such start before each cut."""
    parts = text.split("…")
    for i, head in enumerate(parts[:-1]):
        best = 0
        for form in forms:
            for n in range(min(len(form), len(head)), max(best, _MIN_CUT - 1), -1):
                if head.endswith(form[:n]):
                    best = n
                    break
        if best:
            parts[i] = head[:-best] + REDACTED
    return "…".join(parts)


#: The process's registry, filled as models are built.
default = Redactor()


def register(value: str | None) -> bool:
    """Treat ``value`` as a secret in this process (see :meth:`Redactor.register`)."""
    return default.register(value)


def register_url(url: str) -> None:
    default.register_url(url)


def register_headers(headers: Mapping[str, str]) -> None:
    default.register_headers(headers)


def redact(text: str) -> str:
    """``text`` safe to show or record: see the module's docstring."""
    return default.redact(text)


def redact_settings(value: Any, name: str = "") -> Any:
    """A copy of a settings tree (``dsh config show``) with secrets hidden: a string under a
    credential-like key (``api_key``, ``token``, ``password``…) becomes ``"[redacted]"``, a
    ``headers`` table hides the values of :func:`secret_header` entries, and every other string
    goes through :func:`redact` (URLs lose their credentials)."""
    if isinstance(value, Mapping):
        if name == "headers":
            return {k: REDACTED if isinstance(v, str) and secret_header(k, v)
                    else redact_settings(v) for k, v in value.items()}
        return {k: redact_settings(v, str(k)) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [redact_settings(v) for v in value]
    if isinstance(value, str):
        if value and credential_name(name):
            return REDACTED
        return redact(value)
    return value


def install_log_filter(logger_name: str) -> None:
    """Redact every record of the logger ``logger_name`` (its message with its arguments)
    before any handler sees it; idempotent."""
    import logging

    logger = logging.getLogger(logger_name)
    if not any(isinstance(f, _LogFilter) for f in logger.filters):
        logger.addFilter(_LogFilter())


class _LogFilter:
    def filter(self, record: Any) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # a broken record is logging's problem, not ours
            return True
        clean = redact(message)
        if clean != message:
            record.msg, record.args = clean, ()
        return True
