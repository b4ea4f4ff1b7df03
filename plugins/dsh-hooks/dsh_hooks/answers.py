"""One hook process's answer, as the protocol reads it (part of the engine).

:func:`interpret` turns how a hook process ended (:class:`dsh_hooks.runner.Ran`) into an
:class:`Answer` — ``ok`` (its JSON or plain text), ``block`` (exit 2, stderr the reason) or a
non-blocking ``error`` — with dsh's known secrets redacted from what it printed;
:func:`hook_event` is that answer as the ``x/dsh-hooks/hook`` plugin event. :func:`warn` and
:func:`shown` are how hooks are named on stderr and in the ledger.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping
from typing import Any

import attrs

from dsh_hooks import runner
from dsh_hooks.config import Hook

#: The namespace of this plugin's events: its distribution's name (``x/dsh-hooks/…``).
PLUGIN = "dsh-hooks"
#: Characters of a reason kept in an event (a hook may print up to ``max_output`` bytes).
EVENT_TEXT = 2000
#: A hook's JSON answer is kept in its ``hook`` event up to this size (as JSON text).
EVENT_JSON = 4096
#: A JSON answer nested deeper than this is invalid and blocks (fail closed): Python's JSON
#: reader raises ``RecursionError`` near 1,000 levels, and no protocol answer needs more.
MAX_ANSWER_DEPTH = 64


def warn(message: str) -> None:
    """One line on stderr (escaped: hook output is untrusted text on a terminal)."""
    from dsh.cli.render import escape_controls

    text = message if not sys.stderr.isatty() else escape_controls(message, newlines=False)
    try:
        sys.stderr.write(f"dsh-hooks: {text}\n")
        sys.stderr.flush()
    except (OSError, ValueError):
        pass


def shown(command: str, limit: int = 200) -> str:
    """A command as it is named in the ledger and in messages."""
    one = " ".join(command.split())
    return one if len(one) <= limit else one[: limit - 1] + "…"


@attrs.define
class Answer:
    """One hook's answer. ``kind``: ``ok``, ``block`` (exit 2), ``error`` (non-blocking)."""

    hook: Hook
    kind: str
    reason: str = ""
    json: dict[str, Any] | None = None
    text: str = ""  # exit 0, stdout that is not JSON
    ran: runner.Ran | None = None

    @property
    def name(self) -> str:
        return f"{self.hook.event} hook `{shown(self.hook.command)}`"

    @property
    def specific(self) -> Mapping[str, Any]:
        out = (self.json or {}).get("hookSpecificOutput")
        return out if isinstance(out, Mapping) else {}

    def field(self, key: str) -> Any:
        return (self.json or {}).get(key)


def interpret(hook: Hook, ran: runner.Ran, max_output: int) -> Answer:
    """Exit 0: success (stdout parsed as JSON when it is JSON); exit 2: blocking, stderr is
    the reason; anything else: a non-blocking error, reported on stderr."""
    from dsh.core.redact import redact

    # What a hook prints may reach the ledger, the model and the terminal: dsh's known
    # secrets are redacted first, as everywhere else (dsh.redact).
    ran = attrs.evolve(ran, stdout=redact(ran.stdout), stderr=redact(ran.stderr))
    ans = Answer(hook, "ok", ran=ran)
    where = f"{hook.event} hook `{shown(hook.command)}` ({hook.source})"
    if ran.status == "aborted":  # the run is ending: its own message says why
        ans.kind, ans.reason = "error", ran.stderr
        return ans
    if ran.status == "timeout":
        ans.kind, ans.reason = "error", f"timed out after {hook.timeout:g}s (killed)"
    elif ran.status == "output":
        ans.kind, ans.reason = "error", (f"printed more than {max_output} bytes: killed, "
                                         "its answer is ignored")
    elif ran.status == "spawn":
        ans.kind, ans.reason = "error", ran.stderr
    elif ran.code == 127:
        ans.kind, ans.reason = "error", "command not found (exit 127)"
        warn(f"WARNING: {where}: COMMAND NOT FOUND (exit 127) — this hook is NOT running: "
             f"{_first_line(ran.stderr)}")
        return ans
    elif ran.code == 2:
        ans.kind, ans.reason = "block", ran.stderr.strip() or "(no reason given on stderr)"
        return ans
    elif ran.code != 0:
        ans.kind, ans.reason = "error", f"exit {ran.code}: {_first_line(ran.stderr)}"
    else:
        out = ran.stdout.strip()
        if out.startswith("{"):
            from dsh.core.sanitize import nesting_depth

            try:
                data = json.loads(out)
                deep = nesting_depth(data, MAX_ANSWER_DEPTH) > MAX_ANSWER_DEPTH
            except RecursionError:
                data, deep = None, True
            except ValueError:
                warn(f"{where}: stdout is not valid JSON; used as plain text")
                data, deep = None, False
            if deep:  # an answer dsh cannot read may be a deny: fail closed
                ans.kind, ans.reason = "block", (
                    f"its JSON answer is nested more than {MAX_ANSWER_DEPTH} levels deep: "
                    "an invalid answer, treated as a block")
                warn(f"{where}: {ans.reason}")
                return ans
            if isinstance(data, dict):
                ans.json = data
                message = data.get("systemMessage")
                if isinstance(message, str) and message:
                    warn(f"{hook.event}: {message}")
                return ans
        ans.text = out
        return ans
    warn(f"{where}: {ans.reason} (non-blocking: the run goes on)")
    return ans


def _cut(text: str) -> str:
    return text if len(text) <= EVENT_TEXT else text[:EVENT_TEXT] + "…"


def hook_event(ans: Answer, fields: Mapping[str, Any]) -> dict[str, Any]:
    """The ``x/dsh-hooks/hook`` event of one hook process: which hook, for which tool call,
    how it ended (``status``: ``exit``, ``timeout``, ``output``, ``spawn``, ``aborted``), its
    exit code, its answer (``ok``/``block``/``error``) and reason, its JSON answer when small,
    and how long it took."""
    ran = ans.ran
    data: dict[str, Any] = {
        "event": ans.hook.event, "command": shown(ans.hook.command), "source": ans.hook.source,
        "matcher": ans.hook.matcher, "status": ran.status if ran else "exit",
        "exit": ran.code if ran else None, "answer": ans.kind, "reason": _cut(ans.reason),
        "duration_ms": ran.duration_ms if ran else 0.0,
        "sandbox": ans.hook.policy.describe() if ans.hook.policy is not None else "off",
    }
    for key in ("tool_name", "tool_use_id"):
        if isinstance(fields.get(key), str):
            data[key] = fields[key]
    if ans.json is not None:
        from dsh.ledger.plugin_events import PluginEventError
        from dsh.ledger.plugin_events import clean_data

        try:
            text = json.dumps(ans.json, ensure_ascii=False, default=str, allow_nan=False)
            if len(text) > EVENT_JSON:
                data["json_bytes"] = len(text.encode())
            else:
                data["json"] = clean_data(PLUGIN, "hook", json.loads(text))
        except (ValueError, PluginEventError) as exc:  # NaN, a lone surrogate, a huge int
            data["json_invalid"] = _cut(str(exc))
    return data


def _first_line(text: str) -> str:
    lines = [x for x in text.strip().splitlines() if x.strip()]
    return shown(lines[0], 300) if lines else "(no stderr)"
