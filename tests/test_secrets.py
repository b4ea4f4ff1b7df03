"""dsh's own secrets — API keys, URL credentials, secret headers — stay out of everything it
shows or records (issue 9, section 4; dsh/core/redact.py).

* The redaction rules, property-based: a secret of 8+ characters never survives in any form
  a message can carry it (as is, JSON- or repr-escaped, URL-encoded, base64'd at any alignment,
  cut short before ``…``), whatever characters it holds (regex metacharacters, unicode); a
  dummy key (``x``, ``none``, ``EMPTY``…) or a short one changes no message at all.
* End to end, with ``dsh`` as a real subprocess against a loopback server: credentials in
  ``base_url`` (``user:pass@``, ``?api-key=``) are used — Basic auth, the query kept after the
  endpoint's path — and appear in no stderr, stdout (plain, ``--json``, ``--events``), ledger
  or other file; a key or header that cannot travel in an HTTP header is refused before any
  request, naming the variable or setting and never the value; secret headers and ``api_key``
  are hidden from errors and ``dsh config show``; dummy keys leave a server's message readable;
  the text of ``step/rejected`` and every ``turn/end`` reason are redacted.
"""

from __future__ import annotations

import base64
import json
import logging
import os
import re
import subprocess
import sys
from collections.abc import Callable
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote
from urllib.parse import quote_plus

import pytest
from hypothesis import HealthCheck
from hypothesis import example
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st

from dsh.core import redact as R
from dsh.core.redact import REDACTED
from dsh.core.redact import Redactor
from tests.servers import Reply
from tests.servers import ScriptedServer
from tests.servers import closed_port
from tests.servers import openai_completion
from tests.servers import sse

DSH = [sys.executable, "-m", "dsh"]
KEY = "sk-secrets-test-Q7w9e1r3"
USER = "alice"
PASSWORD = "pw-Zx81-hunter2"
QUERY_KEY = "qk-5531-SECRETval"
HEADER_KEY = "hk-2718-headerSECRET"
BEARER = "bt-3141-bearerSECRET"
BASIC = base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()


def pieces(secret: str, n: int = 8) -> list[str]:
    """Every ``n``-character piece of ``secret``: a message cut inside it leaks too."""
    return [secret[i:i + n] for i in range(len(secret) - n + 1)] or [secret]


SECRET_PIECES = [p for s in (KEY, PASSWORD, QUERY_KEY, HEADER_KEY, BEARER, BASIC)
                 for p in pieces(s)]


def leaks(text: str | bytes, secrets: list[str] = SECRET_PIECES) -> list[str]:
    blob = text.encode() if isinstance(text, str) else text
    return [p for p in secrets if p.encode() in blob]


def leaks_in_files(root: Path, skip: tuple[Path, ...] = ()) -> dict[str, list[str]]:
    found = {}
    for path in root.rglob("*"):
        if path.is_file() and not path.is_symlink() and path not in skip:
            hit = leaks(path.read_bytes())
            if hit:
                found[str(path)] = hit
    return found


# ================================================================================================
# The rules (dsh/core/redact.py), property-based
# ================================================================================================

#: Characters a key may hold in the tests: ASCII of every class (regex metacharacters,
#: quotes, backslash, %, +, /), some control characters, and non-ASCII letters.
KEY_CHARS = st.characters(codec="utf-8", categories=("L", "N", "P", "S", "Zs", "Cc"),
                          exclude_characters="…")
long_keys = st.text(KEY_CHARS, min_size=R.MIN_SECRET_LENGTH, max_size=40).filter(R.is_secret)
#: Stands for each "[redacted]" when a test looks for what survived: a key such as
#: "d] abcde" could otherwise be "found" across the marker and the text after it.
MARK = "\uffff"
#: Text around a secret: ordinary words and punctuation, no secret-looking shapes.
filler = st.text(st.sampled_from("abcdefghijklmnopqrstuvwxyz ABCXYZ.,:;-_()[]{}\"'=/0123456789"),
                 max_size=30)


def _b64_embedded(key: str, before: bytes, after: bytes) -> str:
    return base64.b64encode(before + key.encode("utf-8", "surrogateescape") + after).decode()


ENCODINGS: dict[str, Callable[[str], str]] = {
    "plain": lambda k: k,
    "json": lambda k: json.dumps(k)[1:-1],
    "json, non-ASCII kept": lambda k: json.dumps(k, ensure_ascii=False)[1:-1],
    "json in a repr": lambda k: repr(json.dumps({"key": k}))[1:-1],
    "repr": lambda k: repr(k)[1:-1],
    "repr of a string with both quotes": lambda k: repr("'\"" + k)[1:-1],
    "ascii": lambda k: ascii(k)[1:-1],
    "repr of bytes (httpx's Illegal header value)": lambda k: repr(
        f"Bearer {k}".encode("utf-8", "surrogateescape"))[2:-1],
    "url-encoded": lambda k: quote(k, safe=""),
    "url-encoded, lower-case hex": lambda k: re.sub(r"%[0-9A-F]{2}", lambda m: m[0].lower(),
                                                    quote(k, safe="")),
    "url-encoded, / kept": lambda k: quote(k),
    "form-encoded": lambda k: quote_plus(k),
    "Bearer url-encoded": lambda k: quote(f"Bearer {k}", safe=""),
    "whitespace collapsed": lambda k: " ".join(k.split()),
}


def _decodes_to(text: str, needle: bytes) -> bool:
    """Whether some run of base64 characters in ``text``, read at any of the 4 alignments,
    decodes to bytes containing ``needle``: an oracle independent of the redactor."""
    for run in re.findall(r"[A-Za-z0-9+/]{4,}", text.replace("-", "+").replace("_", "/")):
        for start in range(4):
            chunk = run[start:]
            chunk = chunk[: len(chunk) - len(chunk) % 4]
            if needle in base64.b64decode(chunk):
                return True
    return False


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(key=long_keys, lead=filler, tail=filler, encoding=st.sampled_from(sorted(ENCODINGS)))
@example(key="a.b*c+d?(e)[f]{g}|h^$\\", lead="x ", tail=" y", encoding="plain")
@example(key="ключ-секрет-42", lead="", tail="", encoding="url-encoded")
@example(key="pass word\twith spaces", lead="k=", tail="", encoding="whitespace collapsed")
def test_a_secret_survives_in_no_encoded_form(key: str, lead: str, tail: str,
                                              encoding: str) -> None:
    r = Redactor()
    assert r.register(key)
    encoded = ENCODINGS[encoding](key)
    if R.is_wordlike(key.strip()):  # redacted as a whole word only (see dsh/core/redact.py)
        lead, tail = f"{lead} ", f" {tail}"
    message = f"{lead}{encoded}{tail}"
    clean = r.redact(message)
    assert REDACTED in clean
    survived = clean.replace(REDACTED, MARK)
    assert encoded not in survived and key.strip() not in survived


@settings(max_examples=150, deadline=None)
@given(key=long_keys, before=st.binary(max_size=5), after=st.binary(max_size=5))
@example(key=PASSWORD, before=f"{USER}:".encode(), after=b"")  # HTTP Basic auth
def test_a_secret_base64d_at_any_alignment_cannot_be_decoded_back(
        key: str, before: bytes, after: bytes) -> None:
    r = Redactor()
    r.register(key)
    raw = key.encode("utf-8", "surrogateescape")
    message = f"Authorization: {_b64_embedded(key, before, after)} was refused"
    clean = r.redact(message)
    # The two bytes at each end may share a base64 group with their neighbours; the middle
    # of the key must not be recoverable.
    middle = raw[2:-2]
    assert not _decodes_to(clean, middle), clean


@settings(max_examples=150, deadline=None)
@given(key=long_keys, lead=filler, cut=st.integers(min_value=4, max_value=60),
       encoding=st.sampled_from(["plain", "json", "repr", "url-encoded"]))
def test_a_secret_cut_short_by_a_truncation_is_redacted(key: str, lead: str, cut: int,
                                                        encoding: str) -> None:
    """A detail cut at a limit (``…``) that falls inside the secret keeps a start of it."""
    r = Redactor()
    r.register(key)
    encoded = ENCODINGS[encoding](key)
    cut = min(cut, len(encoded) - 1)
    message = f"{lead}{encoded[:cut]}…"
    clean = r.redact(message)
    assert clean.endswith("…") and REDACTED in clean
    for n in range(4, cut + 1):  # no start of 4+ characters survives right before the cut
        assert not clean.endswith(encoded[:n] + "…")


dummy_or_short = st.one_of(
    st.sampled_from(["x", "none", "EMPTY", "sk-no-key-required", "ollama", "lm-studio",
                     "None", "dummy", "not-needed", "xxxxxxxxxx", "  lm-studio  "]),
    st.text(st.characters(codec="ascii", categories=("L", "N")), min_size=1,
            max_size=R.MIN_SECRET_LENGTH - 1),
)
words = st.lists(st.text(st.sampled_from("abcdefghijklmnopqrstuvwxyzEMPTY-"), min_size=1,
                         max_size=12), max_size=12)


@settings(max_examples=200, deadline=None)
@given(key=dummy_or_short, words=words, inside=st.booleans())
@example(key="x", words=["context", "too", "long", "maximum", "context", "exceeded"],
         inside=True)
def test_a_dummy_or_short_key_changes_no_message(key: str, words: list[str],
                                                 inside: bool) -> None:
    r = Redactor()
    assert not r.register(key)
    glued = [f"pre{key.strip()}post" if inside else key for _ in range(2)]
    message = " ".join(words + glued + ["maximum context length exceeded"])
    assert r.redact(message) == message


@settings(max_examples=100, deadline=None)
@given(word=st.text(st.characters(codec="ascii", categories=["Ll"]), min_size=8, max_size=19)
       .filter(R.is_secret), pre=st.text(st.sampled_from("abcxyz"), min_size=1, max_size=4),
       post=st.text(st.sampled_from("abcxyz"), min_size=1, max_size=4))
def test_a_word_like_secret_is_redacted_as_a_word_not_inside_longer_words(
        word: str, pre: str, post: str) -> None:
    r = Redactor()
    r.register(word)
    longer = f"{pre}{word}{post}"
    assert r.redact(f"see {longer}!") == f"see {longer}!"
    assert r.redact(f"key {word}, again ({word})") == f"key {REDACTED}, again ({REDACTED})"


def test_a_real_key_is_redacted_also_glued_to_other_text() -> None:
    r = Redactor()
    r.register(KEY)
    for text in (f"Bearer{KEY}", f"x{KEY}y", f"%20{KEY}", f"key={KEY}&", f"'{KEY}'"):
        assert KEY not in r.redact(text), text


@pytest.mark.parametrize(("url", "shown"), [
    ("http://alice:pw@h:8/v1", "http://[redacted]@h:8/v1"),
    ("https://tok@h/v1/", "https://[redacted]@h/v1/"),
    ("http://a:b@c@h/x", "http://[redacted]@h/x"),
    ("http://h/v1?api-key=abc&model=x", "http://h/v1?api-key=[redacted]&model=x"),
    ("http://h/v1?API_KEY=abc;token=t&x-amz-signature=s&sig=1",
     "http://h/v1?API_KEY=[redacted];token=[redacted]&x-amz-signature=[redacted]&sig=[redacted]"),
    ("http://h/?key=AIzaXYZ&code=c&max_tokens=5&keyboard=k",
     "http://h/?key=[redacted]&code=[redacted]&max_tokens=5&keyboard=k"),
    ("http://h/cb#access_token=t&state=s", "http://h/cb#access_token=[redacted]&state=s"),
    ("http://h/v1?api_key_env=OPENAI_API_KEY", "http://h/v1?api_key_env=OPENAI_API_KEY"),
    ("http://h/v1", "http://h/v1"),
])
def test_redact_url(url: str, shown: str) -> None:
    assert R.redact_url(url) == shown


@settings(max_examples=150, deadline=None)
@given(key=long_keys, parts=st.lists(st.sampled_from([
    "http://u:p@h/v1?api-key=k1&x=1", "(https://h/?token=t).", "http://[::1]:8/v1]", " ", "…",
    "Bearer abc123def456", "sk-" + "a1" * 12, "[redacted]", "x", "?key=", "@"]), max_size=8),
    with_key=st.booleans())
def test_redaction_is_idempotent(key: str, parts: list[str], with_key: bool) -> None:
    """A reason goes through redact() more than once on its way out (the provider error, the
    turn's reason, the CLI's line): a second pass must change nothing."""
    r = Redactor()
    r.register(key)
    message = "".join(parts) + (key if with_key else "")
    once = r.redact(message)
    assert r.redact(once) == once


def test_urls_inside_text_lose_their_credentials() -> None:
    text = "cannot reach (http://u:p@h/v1?api-key=k1&x=1), then https://h2/?token=t2."
    assert Redactor().redact(text) == ("cannot reach (http://[redacted]@h/v1?api-key=[redacted]"
                                       "&x=1), then https://h2/?token=[redacted].")


@pytest.mark.parametrize(("name", "secret"), [
    ("api_key", True), ("api-key", True), ("x-api-key", True), ("Authorization", True),
    ("Proxy-Authorization", True), ("token", True), ("access_token", True), ("password", True),
    ("client_secret", True), ("X-Amz-Signature", True), ("x-goog-api-key", True),
    ("Ocp-Apim-Subscription-Key", True), ("Cookie", True), ("dbpassword", True), ("dsn", True),
    ("api_key_env", False), ("token_file", False), ("max_tokens", False), ("model", False),
    ("OpenAI-Organization", False), ("HTTP-Referer", False), ("anthropic-version", False),
    ("keyboard", False), ("author", False), ("base_url", False),
])
def test_credential_names(name: str, secret: bool) -> None:
    assert R.credential_name(name) is secret


def test_well_known_key_shapes_are_redacted_whoever_they_belong_to() -> None:
    r = Redactor()
    text = ("keys: sk-proj-AbCdEfGhIjKlMnOpQrStUv ghp_" + "a1" * 18 + " AKIAABCDEFGHIJKLMNOP "
            "Authorization: Basic dXNlcjpwYXNz, Bearer abc123def456ghi789")
    clean = r.redact(text)
    assert clean == ("keys: [redacted] [redacted] [redacted] Authorization: Basic [redacted], "
                     "Bearer [redacted]")
    prose = "HTTP Basic Authentication required; use a bearer token; sk-no-key-required"
    assert r.redact(prose) == prose
    pem = "-----BEGIN RSA PRIVATE KEY-----\nMIIEow\nAAKC\n-----END RSA PRIVATE KEY-----\n"
    assert r.redact(f"key file:\n{pem}done") == f"key file:\n{REDACTED}\ndone"


def test_registered_headers_and_their_credentials() -> None:
    r = Redactor()
    r.register_headers({"Authorization": f"Basic {BASIC}", "X-Api-Key": HEADER_KEY,
                        "Proxy-Authorization": f"Bearer {BEARER}",
                        "OpenAI-Organization": "org-visible-1234"})
    assert {f"Basic {BASIC}", BASIC, f"{USER}:{PASSWORD}", PASSWORD, HEADER_KEY,
            BEARER} <= r.secrets
    assert "org-visible-1234" not in r.secrets
    assert r.redact(f"got {PASSWORD} and {HEADER_KEY}") == f"got {REDACTED} and {REDACTED}"


def test_redact_settings_for_config_show() -> None:
    shown = R.redact_settings({
        "model": "openai:m",
        "models": {"openai:m": {
            "api_key": "whatever-it-is", "api_key_env": "MY_KEY",
            "base_url": f"http://{USER}:{PASSWORD}@h/v1?api-key={QUERY_KEY}",
            "headers": {"Authorization": f"Bearer {BEARER}", "X-Api-Key": HEADER_KEY,
                        "OpenAI-Organization": "org-visible"},
            "options": {"temperature": 0.2, "max_tokens": 100}}},
        "plugins": {"x": {"token": "plugin-token-1", "names": ["a", "b"]}},
    })
    assert shown == {
        "model": "openai:m",
        "models": {"openai:m": {
            "api_key": REDACTED, "api_key_env": "MY_KEY",
            "base_url": f"http://{REDACTED}@h/v1?api-key={REDACTED}",
            "headers": {"Authorization": REDACTED, "X-Api-Key": REDACTED,
                        "OpenAI-Organization": "org-visible"},
            "options": {"temperature": 0.2, "max_tokens": 100}}},
        "plugins": {"x": {"token": REDACTED, "names": ["a", "b"]}},
    }


def test_log_records_are_redacted(caplog: pytest.LogCaptureFixture) -> None:
    R.register(QUERY_KEY)
    R.install_log_filter("dsh.test.secrets")
    R.install_log_filter("dsh.test.secrets")  # idempotent
    assert len(logging.getLogger("dsh.test.secrets").filters) == 1
    with caplog.at_level(logging.INFO, logger="dsh.test.secrets"):
        logging.getLogger("dsh.test.secrets").info("POST %s failed", f"http://h/?k={QUERY_KEY}")
    assert caplog.messages == [f"POST http://h/?k={REDACTED} failed"]


# ================================================================================================
# End to end: dsh as a subprocess, a loopback server
# ================================================================================================


def run(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*DSH, *args], env=env, stdin=subprocess.DEVNULL, capture_output=True,
                          text=True, timeout=60)


@pytest.fixture
def server() -> Iterator[ScriptedServer]:
    with ScriptedServer() as s:
        yield s


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    """dsh with no installed plugin, a config file, and OPENAI_API_KEY set to KEY."""
    config = tmp_path / "dsh.toml"
    config.write_text("autoload = false\n")
    e = {k: v for k, v in os.environ.items()
         if k not in ("NO_COLOR", "DSH_LOAD_PLUGINS", "DSH_TRACE_HOOKS", "OPENAI_BASE_URL",
                      "OPENAI_API_KEY")}
    e.update(DSH_CONFIG=str(config), OPENAI_API_KEY=KEY)
    return e


def configure(env: dict[str, str], text: str) -> Path:
    config = Path(env["DSH_CONFIG"])
    config.write_text("autoload = false\n" + text)
    return config


def ledger_events(env: dict[str, str]) -> list[dict[str, Any]]:
    (path,) = (Path(env["DSH_HOME"]) / "sessions").glob("*.jsonl")
    return [json.loads(line) for line in path.read_text().splitlines()]


def assert_nothing_leaked(env: dict[str, str], tmp_path: Path,
                          *outputs: subprocess.CompletedProcess[str]) -> None:
    for r in outputs:
        assert not leaks(r.stdout), (r.args, r.stdout)
        assert not leaks(r.stderr), (r.args, r.stderr)
    assert not leaks_in_files(tmp_path, skip=(Path(env["DSH_CONFIG"]),))


def _echo_error(status: int) -> Reply:
    """An error that echoes every credential of the request, in several encodings."""
    return Reply(status, {"error": {"message": (
        f"denied: {USER}:{PASSWORD} (Basic {BASIC}; {quote(PASSWORD)}), key {QUERY_KEY} "
        f"from http://{USER}:{PASSWORD}@proxy/v1?api-key={QUERY_KEY}"), "code": "denied"}})


CREDENTIAL_URL_CASES: dict[str, tuple[list[Reply], list[str], int]] = {
    # name: (replies, dsh run options, exit code)
    "success, --json": ([Reply(body=openai_completion("fine"))], ["--json"], 0),
    "401 echoing the credentials": ([_echo_error(401)], [], 1),
    "400 echoing the credentials, --events": ([_echo_error(400)], ["--events"], 1),
    "404: the message shows the endpoint": (
        [Reply(404, "404 page not found", {"content-type": "text/plain"})], ["--json"], 1),
    "an HTML page echoing the key URL-encoded": (
        [Reply(body=f"<html>bad key {quote(QUERY_KEY)} for {quote(PASSWORD)}</html>",
               headers={"content-type": "text/html"})], [], 1),
    "an error event in a stream": (
        [Reply(chunks=[sse({"error": {"message": f"revoked: {QUERY_KEY}"}})])], ["--events"], 1),
}


@pytest.mark.parametrize("source", ["OPENAI_BASE_URL", "base_url setting"])
@pytest.mark.parametrize("case", list(CREDENTIAL_URL_CASES))
def test_credentials_in_the_base_url_are_used_and_never_shown(
        env: dict[str, str], server: ScriptedServer, tmp_path: Path, source: str,
        case: str) -> None:
    replies, options, code = CREDENTIAL_URL_CASES[case]
    base = f"http://{USER}:{PASSWORD}@127.0.0.1:{server.port}/v1?api-key={QUERY_KEY}&x=1"
    if source == "OPENAI_BASE_URL":
        env["OPENAI_BASE_URL"] = base
        configure(env, '[models."openai:m"]\nretries = 0\n')
    else:
        configure(env, f'[models."openai:m"]\nretries = 0\nbase_url = "{base}"\n')
    server.script(*replies)
    r = run(env, "run", "-m", "openai:m", *options, "hello")
    assert r.returncode == code, (r.stdout, r.stderr)
    # Used: the endpoint's path is appended to the base URL's path, the query kept after it;
    # the userinfo travels as HTTP Basic auth.
    (received,) = server.received
    assert received.path == f"/v1/chat/completions?api-key={QUERY_KEY}&x=1"
    assert received.headers["authorization"] == f"Basic {BASIC}"
    # Never shown.
    others = [run(env, *args) for args in (["models"], ["models", "--json"], ["config", "show"],
                                           ["sessions", "show", "--full", "latest"])]
    assert_nothing_leaked(env, tmp_path, r, *others)
    if code:
        events = ledger_events(env)
        assert events[-1]["type"] == "turn/end" and events[-1]["outcome"] == "error"
        assert REDACTED in events[-1]["reason"] and REDACTED in r.stderr
    if case.startswith("404"):
        shown = f"127.0.0.1:{server.port}/v1/chat/completions?api-key={REDACTED}&x=1"
        assert f"{shown} not found (HTTP 404)" in r.stderr


def test_an_unreachable_base_url_is_named_without_its_credentials(
        env: dict[str, str], tmp_path: Path) -> None:
    port = closed_port()
    configure(env, f'[models."openai:m"]\nretries = 0\nbase_url = '
                   f'"http://{USER}:{PASSWORD}@127.0.0.1:{port}/v1/?api-key={QUERY_KEY}"\n')
    r = run(env, "run", "-m", "openai:m", "--json", "hello")
    assert r.returncode == 1
    assert (f"cannot connect to http://{REDACTED}@127.0.0.1:{port}/v1?api-key={REDACTED}"
            in r.stderr)
    assert_nothing_leaked(env, tmp_path, r)


@pytest.mark.parametrize("base", [f"htp://{USER}:{PASSWORD}@h/v1?api-key={QUERY_KEY}",
                                  f"http://{USER}:{PASSWORD}@h:port/v1?api-key={QUERY_KEY}"])
def test_a_bad_base_url_is_named_without_its_credentials(env: dict[str, str], tmp_path: Path,
                                                         base: str) -> None:
    configure(env, f'[models."openai:m"]\nbase_url = "{base}"\n')
    r = run(env, "run", "-m", "openai:m", "--json", "hello")
    assert r.returncode == 2
    shown = R.redact_url(base)
    assert shown.count(REDACTED) == 2
    assert r.stderr == f"dsh: error: openai:m: base_url must be an http(s) URL, got {shown!r}\n"
    assert json.loads(r.stdout)["reason"] in r.stderr
    assert_nothing_leaked(env, tmp_path, r)


BAD_KEYS: dict[str, tuple[str, str, str, str]] = {
    # name: (where the key is, the key, what the message names, what it says)
    "newline in OPENAI_API_KEY": ("env", "sk-abc\nSECRETPART-1", "OPENAI_API_KEY",
                                  "contains a line break"),
    "carriage return": ("env", "sk-abc\r\nSECRETPART-1", "OPENAI_API_KEY",
                        "contains a line break"),
    "escape character": ("env", "sk-abc\x1b[2JSECRETPART-1", "OPENAI_API_KEY",
                         "contains a control character"),
    "non-ASCII": ("env", "sk-abc\u2019SECRETPART-1", "OPENAI_API_KEY",
                  "contains non-ASCII characters (a copy-paste accident?)"),
    "newline in api_key_env's variable": ("api_key_env", "sk-abc\nSECRETPART-1", "MY_KEY",
                                          "contains a line break"),
    "newline in the api_key setting": ("api_key", "sk-abc\nSECRETPART-1", "the api_key setting",
                                       "contains a line break"),
    "a space at the end of the api_key setting": ("api_key", "sk-abcSECRETPART-1 ",
                                                  "the api_key setting",
                                                  "starts or ends with whitespace"),
}


@pytest.mark.parametrize("case", list(BAD_KEYS))
@pytest.mark.parametrize("output", ["plain", "--json"])
def test_a_key_that_cannot_be_a_header_is_refused_before_any_request(
        env: dict[str, str], server: ScriptedServer, tmp_path: Path, case: str,
        output: str) -> None:
    where, key, named, says = BAD_KEYS[case]
    table = f'[models."openai:m"]\nbase_url = "{server.url}/v1"\n'
    if where == "env":
        env["OPENAI_API_KEY"] = key
    elif where == "api_key_env":
        env["MY_KEY"] = key
        table += 'api_key_env = "MY_KEY"\n'
    else:
        table += f"api_key = {json.dumps(key)}\n"
    configure(env, table)
    r = run(env, "run", "-m", "openai:m", *([output] if output != "plain" else []), "hello")
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert r.stderr == f"dsh: error: openai: the API key from {named} {says} — copy it again " \
                       "(the key is not shown)\n"
    if output == "--json":
        assert json.loads(r.stdout)["reason"] in r.stderr
    assert server.received == []
    secret_bits = [*pieces("SECRETPART-1", 6), "sk-abc"]
    for text in (r.stdout, r.stderr):
        assert not [p for p in secret_bits if p in text]
    for path in tmp_path.rglob("*"):
        if path.is_file() and path != Path(env["DSH_CONFIG"]):
            assert b"SECRETPART" not in path.read_bytes(), path


def test_a_header_that_cannot_be_sent_is_refused_naming_it(
        env: dict[str, str], server: ScriptedServer) -> None:
    configure(env, f'[models."openai:m"]\nbase_url = "{server.url}/v1"\n'
                   '[models."openai:m".headers]\n"X-Api-Key" = "hk-1\\nSECRETPART-2"\n')
    r = run(env, "run", "-m", "openai:m", "hello")
    assert r.returncode == 2
    assert r.stderr == ("dsh: error: openai:m: `headers`: the value of 'x-api-key' contains a "
                        "line break (it is not shown)\n")
    assert server.received == []


def test_secret_headers_are_sent_and_never_shown(env: dict[str, str], server: ScriptedServer,
                                                 tmp_path: Path) -> None:
    configure(env, f'[models."openai:m"]\nbase_url = "{server.url}/v1"\nretries = 0\n'
                   f'[models."openai:m".headers]\n"x-api-key" = "{HEADER_KEY}"\n'
                   f'"proxy-authorization" = "Bearer {BEARER}"\n'
                   '"OpenAI-Organization" = "org-visible"\n')
    echo = f"headers were x-api-key={HEADER_KEY} proxy-authorization=Bearer {BEARER}"
    server.script(Reply(400, {"error": {"message": echo}}),
                  Reply(500, {"error": {"message": echo}}))
    plain = run(env, "run", "-m", "openai:m", "hello")
    events = run(env, "run", "-m", "openai:m", "--events", "hello")
    assert (plain.returncode, events.returncode) == (1, 1)
    assert [x.headers["x-api-key"] for x in server.received] == [HEADER_KEY] * 2
    assert [x.headers["proxy-authorization"] for x in server.received] == [f"Bearer {BEARER}"] * 2
    assert "headers were x-api-key=[redacted] proxy-authorization=[redacted]" in plain.stderr
    shown = run(env, "config", "show")
    assert shown.returncode == 0
    assert 'OpenAI-Organization = "org-visible"' in shown.stdout
    assert shown.stdout.count(f'"{REDACTED}"') == 2
    assert_nothing_leaked(env, tmp_path, plain, events, shown)


def test_config_show_hides_api_key_and_url_credentials(env: dict[str, str],
                                                       tmp_path: Path) -> None:
    configure(env, '[models."openai:m"]\n'
                   f'api_key = "{KEY}"\napi_key_env = "MY_KEY"\n'
                   f'base_url = "https://{USER}:{PASSWORD}@llm.example/v1?api-key={QUERY_KEY}"\n'
                   '[plugins.notes]\ntoken = "plugin-token-XYZ-1"\ncolor = "blue"\n')
    r = run(env, "config", "show")
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert f'api_key = "{REDACTED}"' in out and 'api_key_env = "MY_KEY"' in out
    assert f'base_url = "https://{REDACTED}@llm.example/v1?api-key={REDACTED}"' in out
    assert f'token = "{REDACTED}"' in out and 'color = "blue"' in out
    assert "plugin-token-XYZ" not in out
    assert_nothing_leaked(env, tmp_path, r)


DUMMY_KEYS = ["x", "none", "EMPTY", "sk-no-key-required", "ollama", "lm-studio"]
SERVER_MESSAGE = ("This model's maximum context length is 4096 tokens. However, your messages "
                  "resulted in 5000 tokens (exceeded by none of the tools; ollama and lm-studio "
                  "say EMPTY, sk-no-key-required). Please reduce the length of the messages.")


@pytest.mark.parametrize("key", DUMMY_KEYS)
def test_a_dummy_key_leaves_the_servers_message_readable(
        env: dict[str, str], server: ScriptedServer, key: str) -> None:
    env["OPENAI_API_KEY"] = key
    configure(env, f'[models."openai:m"]\nbase_url = "{server.url}/v1"\n')
    server.script(Reply(400, {"error": {"message": SERVER_MESSAGE,
                                        "code": "context_length_exceeded"}}))
    r = run(env, "run", "-m", "openai:m", "--json", "hello")
    assert r.returncode == 1
    assert server.received[0].headers["authorization"] == f"Bearer {key}"  # it was in play
    assert SERVER_MESSAGE in r.stderr and SERVER_MESSAGE in json.loads(r.stdout)["reason"]
    assert SERVER_MESSAGE in ledger_events(env)[-1]["reason"]


GUARD = '''
from dsh import hookimpl


@hookimpl
def pre_step(step):
    if step.text.startswith("reject"):
        step.reject("refused: " + step.text)
    elif step.text.startswith("raise"):
        raise RuntimeError("cannot handle " + step.text)
'''


@pytest.mark.parametrize(("verb", "outcome", "code"), [("reject", "rejected", 4),
                                                       ("raise", "error", 1)])
def test_rejected_text_and_turn_reasons_are_redacted(
        env: dict[str, str], server: ScriptedServer, tmp_path: Path, verb: str, outcome: str,
        code: int) -> None:
    """The tutorial's case: a pre_step guard rejects a message holding a key. The ledger keeps
    the rejected text, readable, with the key and the URL credentials redacted."""
    plugins = tmp_path / "plugins"
    plugins.mkdir()
    (plugins / "dsh_test_guard.py").write_text(GUARD)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(plugins), env.get("PYTHONPATH")]))
    configure(env, f'load = ["dsh_test_guard"]\n[models."openai:m"]\n'
                   f'base_url = "{server.url}/v1?api-key={QUERY_KEY}"\n')
    prompt = (f"{verb} this: my key is {KEY}, the proxy is "
              f"http://{USER}:{PASSWORD}@proxy.example/v1 and json {json.dumps(KEY)}")
    r = run(env, "run", "-m", "openai:m", "--json", prompt)
    assert r.returncode == code, r.stderr
    assert server.received == []
    result = json.loads(r.stdout)
    assert result["outcome"] == outcome
    events = ledger_events(env)
    end = events[-1]
    assert end["type"] == "turn/end" and end["reason"] == result["reason"]
    assert f"{verb} this: my key is {REDACTED}, the proxy is http://{REDACTED}@proxy.example/v1" \
        in end["reason"]
    if verb == "reject":
        (rejected,) = [e for e in events if e["type"] == "step/rejected"]
        assert rejected["text"] == (f"reject this: my key is {REDACTED}, the proxy is "
                                    f"http://{REDACTED}@proxy.example/v1 and json "
                                    f'"{REDACTED}"')
        assert rejected["reason"] == f"refused: {rejected['text']}"
    else:
        assert "dsh_test_guard" in end["reason"] and "RuntimeError" in end["reason"]
    assert_nothing_leaked(env, tmp_path, r)


def test_httpx_request_logs_are_redacted(server: ScriptedServer, tmp_path: Path,
                                         monkeypatch: pytest.MonkeyPatch,
                                         caplog: pytest.LogCaptureFixture) -> None:
    """httpx logs each request's URL at INFO: a library user who turns logging on must not
    get the query's key."""
    from dsh.run.app import App

    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    server.script(Reply(body=openai_completion("fine")))
    app = App.from_config({"autoload": False, "sessions_dir": str(tmp_path / "s"),
                           "models": {"openai:m": {
                               "base_url": f"{server.url}/v1?api-key={QUERY_KEY}"}}})
    with caplog.at_level(logging.INFO, logger="httpx"):
        result = app.run("hello", model="openai:m")
    assert result.outcome == "completed", result.reason
    assert server.received[0].path.endswith(f"?api-key={QUERY_KEY}")
    logged = [r.getMessage() for r in caplog.records if r.name == "httpx"]
    assert logged and all(QUERY_KEY not in m for m in logged)
    assert any(f"api-key={REDACTED}" in m for m in logged)


def test_a_configured_authorization_header_replaces_the_key(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Header names ignore case: `Authorization` in `headers` is the only Authorization sent
    (the Bearer key does not travel next to it), and a name set twice is an error."""
    import threading
    from http.server import BaseHTTPRequestHandler
    from http.server import ThreadingHTTPServer

    from dsh.core.errors import ConfigError
    from dsh.llm.openai import OpenAIModel
    from dsh.run.app import App

    seen: list[list[str]] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            seen.append(self.headers.get_all("authorization") or [])
            self.rfile.read(int(self.headers["content-length"]))
            body = json.dumps(openai_completion("ok")).encode()
            self.send_response(200)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    with ThreadingHTTPServer(("127.0.0.1", 0), Handler) as httpd:
        threading.Thread(target=httpd.serve_forever, args=(0.02,), daemon=True).start()
        base = f"http://127.0.0.1:{httpd.server_address[1]}/v1"
        app = App.from_config({"autoload": False, "sessions_dir": str(tmp_path / "s"),
                               "models": {"openai:m": {"base_url": base, "headers": {
                                   "Authorization": f"Bearer {BEARER}"}}}})
        assert app.run("hello", model="openai:m").outcome == "completed"
        httpd.shutdown()
    assert seen == [[f"Bearer {BEARER}"]]
    with pytest.raises(ConfigError, match="`headers` sets 'X-Api-Key' twice"):
        OpenAIModel("m", {"base_url": base, "headers": {"x-api-key": "a", "X-Api-Key": "b"}})
