"""``CLAUDE_ENV_FILE``: the variables SessionStart hooks persist for later commands.

As in Claude Code, each session start gets a fresh, empty file (a ``0600`` file in a fresh
``0700`` directory of the temp directory) whose path is in ``CLAUDE_ENV_FILE`` for the
SessionStart hooks only. After they ran, dsh reads it with a bounded reader (:func:`read`):
``export NAME=value`` and ``NAME=value`` lines (the value in shell quoting, one word), blank
lines and ``#`` comments. What it accepts becomes part of the environment of dsh-shell's
commands for the rest of the run (the ``dsh_shell.env`` key of the run's data, which dsh-shell
reads); each refusal is one line on stderr naming the file's line. Never secrets: a name that
dsh's credential filter flags (``*_API_KEY``, ``*TOKEN*``…), a value that dsh's redaction
would hide, and the variables that change how programs load or shells start (``LD_*``,
``BASH_ENV``…) are refused. What was set is recorded as ``x/dsh-hooks/env`` before any
command sees it.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile

#: Bytes of the file read at most; past them the rest is ignored (one warning).
CAP = 64 * 1024
#: Characters of one line at most.
LINE_CAP = 8 * 1024
#: Variables at most.
MAX_VARS = 256
#: Names never taken: they change how programs are loaded or shells start.
FORBIDDEN = re.compile(r"^(LD_\w*|DYLD_\w*|BASH_ENV|ENV|BASH_FUNC_\w*|SHELLOPTS|BASHOPTS|IFS|"
                       r"PROMPT_COMMAND|PS4|PYTHONSTARTUP|PYTHONPATH|PYTHONHOME|NODE_OPTIONS|"
                       r"PERL5OPT|PERL5LIB|RUBYOPT|GCONV_PATH|CLAUDE_ENV_FILE|DSH_\w*)$")
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_VAR = re.compile(r"\$(?:\{([A-Za-z_][A-Za-z0-9_]*)\}|([A-Za-z_][A-Za-z0-9_]*))")

#: ``RunContext.data`` key dsh-shell reads the variables from (dsh_shell.process.SESSION_ENV).
SESSION_ENV = "dsh_shell.env"


def create() -> tuple[str, str]:
    """A fresh private directory and an empty ``0600`` file in it: (directory, file)."""
    d = tempfile.mkdtemp(prefix="dsh-env-")
    path = os.path.join(d, "session.env")
    os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600))
    return d, path


def remove(directory: str) -> None:
    shutil.rmtree(directory, ignore_errors=True)


def read(path: str, visible: dict[str, str] | None = None
         ) -> tuple[dict[str, str], list[str]]:
    """The variables in the file and the refusals (``LINE N: why``), never raising.
    ``$NAME`` / ``${NAME}`` in a value not in single quotes is expanded, as bash would, from
    ``visible`` (the commands' environment) and the lines before it; an unknown name is
    empty."""
    from dsh.core import files

    try:
        data = files.read_regular(path, CAP)
        cut = False
    except files.TooLarge:
        with open(path, "rb") as f:
            data = f.read(CAP)
        cut = True
    except files.NotRegular as exc:
        return {}, [f"it is {exc.kind}, not a regular file: ignored"]
    except OSError as exc:
        return {}, [f"cannot read it: {files.reason(exc)}"]
    out: dict[str, str] = {}
    refused: list[str] = []
    if cut:
        data = data[: data.rfind(b"\n") + 1]
        refused.append(f"larger than {CAP} bytes: the rest is ignored")
    for n, raw in enumerate(data.split(b"\n"), 1):
        why = _refusal(raw, out, visible or {})
        if why:
            refused.append(f"line {n}: {why}")
    return out, refused


def _refusal(raw: bytes, out: dict[str, str], visible: dict[str, str]) -> str:
    """Parse one line into ``out``; the reason it was refused, or "" (taken or blank)."""
    from dsh.core.redact import credential_name
    from dsh.core.redact import redact

    if len(raw) > LINE_CAP:
        return f"longer than {LINE_CAP} bytes"
    if b"\0" in raw:
        return "binary (a NUL byte)"
    try:
        line = raw.decode("utf-8").strip()
    except UnicodeDecodeError:
        return "not UTF-8 text"
    if not line or line.startswith("#"):
        return ""
    if line.startswith("export "):
        line = line[len("export "):].lstrip()
    name, eq, rest = line.partition("=")
    if not eq or not _NAME.fullmatch(name):
        return "not `export NAME=value` or `NAME=value`"
    import shlex

    try:
        words = shlex.split(rest, comments=True)
    except ValueError as exc:
        return f"{name}: value is not valid shell quoting ({exc})"
    if len(words) > 1:
        return f"{name}: value is more than one word (quote it)"
    value = words[0] if words else ""
    if "$" in value and "'" not in rest:
        seen = {**visible, **out}
        value = _VAR.sub(lambda m: seen.get(m.group(1) or m.group(2), ""), value)
    if any(ord(c) < 32 and c != "\t" for c in value):
        return f"{name}: value holds control characters"
    if FORBIDDEN.match(name):
        return f"{name}: changes how programs load or shells start: not taken"
    if credential_name(name):
        return f"{name}: a credential's name: secrets are not taken from CLAUDE_ENV_FILE"
    if redact(value) != value:
        return f"{name}: the value looks like a secret: not taken"
    if name not in out and len(out) >= MAX_VARS:
        return f"{name}: more than {MAX_VARS} variables"
    out[name] = value
    return ""
