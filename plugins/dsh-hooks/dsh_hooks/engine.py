"""The protocol mapped onto dsh's hooks, in one module (docs/hooks-plugin.md has the table).

One :class:`Engine` per run (``RunContext.data``), built when the run's agent has hooks
configured. Everything a hook adds that the model will read goes through a path dsh records
before the request that carries it (C3): injected context (``context/injected``, its
``source`` naming the event and the command), the tool result (``tool/result``), the step's
rejection (``step/rejected``) or the follow-up message (``user/message``).

What the model does not see is recorded too, as plugin events (dsh.plugin_events, issue 11):
``x/dsh-hooks/hook`` for every hook process (how it ended, what it answered) and
``x/dsh-hooks/decision`` for what dsh did with the answers (a call denied, allowed, asked or
rewritten, a prompt blocked, a turn continued, a compaction vetoed, the run stopped).
"""

from __future__ import annotations

import json
import os
import re
import sys
import threading
import time
import weakref
from collections.abc import Mapping
from typing import Any

import attrs

from dsh_hooks import runner
from dsh_hooks.config import MATCHED
from dsh_hooks.config import Hook
from dsh_hooks.config import HookSettings

KEY = "dsh_hooks"
#: The namespace of this plugin's events: its distribution's name (``x/dsh-hooks/…``).
PLUGIN = "dsh-hooks"
#: Characters of a reason kept in an event (a hook may print up to ``max_output`` bytes).
EVENT_TEXT = 2000
#: A hook's JSON answer is kept in its ``hook`` event up to this size (as JSON text).
EVENT_JSON = 4096
#: Ledgers (open sessions) this process has already started: SessionStart fires once each.
_started: weakref.WeakSet[Any] = weakref.WeakSet()
_started_lock = threading.Lock()


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


def matches(matcher: str, *names: str) -> bool:
    """Claude Code's matcher rules: empty or ``*`` match all; a plain name or ``A|B``
    alternation matches exactly; anything else is a regex searched in the name."""
    if matcher in ("", "*"):
        return True
    if re.fullmatch(r"[\w|]+", matcher):
        alternatives = matcher.split("|")
        return any(n in alternatives for n in names)
    return any(re.search(matcher, n) for n in names)


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
            try:
                data = json.loads(out)
            except ValueError:
                warn(f"{where}: stdout is not valid JSON; used as plain text")
                data = None
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


class Engine:
    """The hooks of one run of one agent."""

    def __init__(self, settings: HookSettings, ctx: Any, *, workspace: str,
                 ledger: Any = None) -> None:
        self.settings = settings
        self.ctx = ctx
        self.ledger = ledger if ledger is not None else getattr(ctx, "ledger", None)
        self.workspace = workspace
        self.env = runner.child_env(settings.env_keep, settings.project_dir)
        #: Turns continued by a Stop hook (``stop_hook_active`` on re-entry).
        self.stop_active: set[int] = set()
        #: Tool calls whose approval a hook gave: ``id(call) → approve_all before``.
        self.approved: dict[int, bool] = {}

    # ---------------------------------------------------------------- firing

    def base(self, event: str) -> dict[str, Any]:
        ctx, ledger = self.ctx, self.ledger
        return {
            "session_id": ledger.session_id if ledger is not None else "",
            "transcript_path": str(ledger.path) if ledger is not None and ledger.path else "",
            "cwd": self.settings.project_dir,
            "hook_event_name": event,
            "permission_mode": "bypassPermissions" if getattr(ctx, "approve_all", False)
            else "default",
        }

    def fire(self, event: str, fields: Mapping[str, Any], *names: str,
             cancellable: bool = True) -> list[Answer]:
        """Run every hook of ``event`` whose matcher matches one of ``names`` (all of them
        for events without matchers), in parallel; answers in configuration order.

        Each hook's wait is bounded by its ``timeout`` and, when ``cancellable``, by the run's
        cancellation: an abort kills every hook process of the event at once, the answers
        are recorded, and :class:`~dsh.core.errors.Cancelled` is raised so the run ends now."""
        hooks = self.settings.active(event)
        if event in MATCHED:
            hooks = [h for h in hooks if matches(h.matcher, *names)]
        seen: set[str] = set()
        unique = []
        for h in hooks:  # identical commands run once, as the protocol does
            if h.command not in seen:
                seen.add(h.command)
                unique.append(h)
        if not unique:
            return []
        payload = json.dumps({**self.base(event), **fields}, ensure_ascii=False,
                             default=str).encode()
        cap = self.settings.max_output
        cancel = getattr(self.ctx, "cancel", None) if cancellable else None

        def one(h: Hook) -> Answer:
            ran = runner.run(h.command, payload, timeout=h.timeout, cwd=self.settings.project_dir,
                             env=self.env, max_output=cap, cancel=cancel)
            return interpret(h, ran, cap)

        answers: list[Answer | None] = [None] * len(unique)
        start = time.perf_counter()
        try:
            if len(unique) == 1:
                answers[0] = one(unique[0])
            else:
                def slot(i: int, h: Hook) -> None:
                    answers[i] = one(h)

                threads = [threading.Thread(target=slot, args=(i, h), daemon=True,
                                            name="dsh-hook") for i, h in enumerate(unique)]
                for t in threads:
                    t.start()
                for t in threads:
                    t.join()
        except BaseException:  # SIGTERM, a second Ctrl-C: the hooks were killed with the run
            why = getattr(self.ctx.cancel, "reason", "") if self.ctx is not None else ""
            took = round((time.perf_counter() - start) * 1000, 3)
            for h, ans in zip(unique, answers, strict=True):
                ans = ans or Answer(h, "error", f"killed: the run was aborted "
                                    f"({why or 'interrupted'})",
                                    ran=runner.Ran("aborted", None, "", "", took))
                self.record("hook", hook_event(ans, fields))
            raise
        done = [a for a in answers if a is not None]
        for ans in done:
            self.record("hook", hook_event(ans, fields))
        if cancel is not None:
            cancel.check()  # aborted while the hooks ran: the run ends now (Cancelled)
        return done

    def record(self, name: str, data: Mapping[str, Any]) -> None:
        """Write ``x/dsh-hooks/NAME`` to the session's ledger (names, data and redaction
        checked as for any plugin event). Under its distribution's name whatever name the
        plugin was loaded under (``hooks`` by its entry point, ``dsh_hooks`` by ``load``), so
        the app's plugin-name check is not asked. Outside a run (``dsh sessions compact``)
        it is made durable at once. A failure to record is a warning, never a failed hook."""
        from dsh.core.errors import DshError
        from dsh.host.runcontext import current_or_none
        from dsh.ledger import plugin_events

        ctx = current_or_none()
        ledger = ctx.ledger if ctx is not None else self.ledger
        if ledger is None:  # `dsh hooks test`: no session
            return
        try:
            plugin_events.record(ledger, PLUGIN, name, data, durable=ctx is None)
        except DshError as exc:
            warn(f"cannot record {PLUGIN} event {name!r}: {exc}")

    def decided(self, event: str, decision: str, ans: Answer | None, reason: str = "",
                **more: Any) -> None:
        """Record what dsh did with an event's answers (``x/dsh-hooks/decision``)."""
        data: dict[str, Any] = {"event": event, "decision": decision,
                                "reason": _cut(reason)}
        if ans is not None:
            data["command"] = shown(ans.hook.command)
            data["source"] = ans.hook.source
        data.update(more)
        self.record("decision", data)

    def stop_run(self, ans: Answer) -> str | None:
        """``continue: false``: stop the run after this step; returns the stop reason."""
        if ans.field("continue") is not False:
            return None
        reason = str(ans.field("stopReason") or f"stopped by {ans.name}")
        warn(f"{ans.name} stopped the run: {reason}")
        self.decided(ans.hook.event, "stop-run", ans, reason)
        if self.ctx is not None:
            self.ctx.stop()
        return reason

    # ---------------------------------------------------------------- tool names

    def present(self, name: str, arguments: Mapping[str, Any]) -> tuple[str, dict[str, Any]]:
        alias = self.settings.tools.get(name)
        if alias is None:
            return name, dict(arguments)
        shown_input: dict[str, Any] = {}
        for key, value in arguments.items():
            outer = alias.arguments.get(key, key)
            if outer in alias.paths and isinstance(value, str):
                value = os.path.normpath(os.path.join(self.workspace, value))
            shown_input[outer] = value
        return alias.name, shown_input

    def back(self, name: str, updated: Mapping[str, Any], known: set[str] | None
             ) -> dict[str, Any]:
        """``updatedInput`` in dsh's argument names (paths relative to the workspace);
        keys the tool does not take (``description`` of Bash, …) are dropped."""
        alias = self.settings.tools.get(name)
        reverse = {v: k for k, v in alias.arguments.items()} if alias else {}
        out: dict[str, Any] = {}
        for key, value in updated.items():
            inner = reverse.get(key, key)
            if alias and key in alias.paths and isinstance(value, str) and os.path.isabs(value):
                rel = os.path.relpath(value, self.workspace)
                if rel != os.pardir and not rel.startswith(os.pardir + os.sep):
                    value = rel  # inside the workspace ("..x" is a name inside it)
            if known is None or inner in known:
                out[inner] = value
        return out


def begin(turn: Any, raw: Mapping[str, Any]) -> Engine | None:
    """The run's engine (also stored in ``ctx.data``), or None when no hook is configured.
    Called at the run's first step; SessionEnd is registered as one of the run's cleanups."""
    from dsh_hooks import config

    info = turn.agent.info
    workspace = info.plugin_settings("shell").get("workspace")
    settings = config.load(raw, _where(info), workspace)
    if settings.empty:
        return None
    ws = os.path.realpath(os.path.expanduser(workspace)) if workspace else os.getcwd()
    eng = Engine(settings, turn.ctx, workspace=ws)
    turn.ctx.data[KEY] = eng
    if turn.ctx.parent is None and settings.active("SessionEnd"):
        turn.ctx.add_cleanup(lambda: session_end(eng))
    return eng


def for_compaction(request: Any) -> Engine | None:
    """The engine of a compaction: the run's, or one built for ``dsh sessions compact``."""
    ctx = request.ctx
    if ctx is not None:
        eng = ctx.data.get(KEY)
        return eng if isinstance(eng, Engine) else None
    from dsh_hooks import config

    info = request.agent.info
    raw = info.plugin_settings("hooks")
    if not raw:
        return None
    workspace = info.plugin_settings("shell").get("workspace")
    settings = config.load(raw, _where(info), workspace)
    if settings.empty:
        return None
    return Engine(settings, None, workspace=workspace or os.getcwd(), ledger=request.ledger)


def _where(info: Any) -> str:
    own = info.settings.get("plugin_settings", {}).get("hooks")
    return f"agents.{info.name}.plugin_settings.hooks" if own else "plugins.hooks"


# -------------------------------------------------------------------- the events


def pre_step(eng: Engine, step: Any) -> None:
    from dsh.run.loop import InboxItem

    ctx = eng.ctx
    if step.index == 0 and ctx.parent is None:
        with _started_lock:
            first = ctx.ledger not in _started
            _started.add(ctx.ledger)
        if first and eng.settings.active("SessionStart"):
            source = "startup" if ctx.ledger.projection.turn <= 1 else "resume"
            for ans in eng.fire("SessionStart", {"source": source}, source):
                if ans.kind == "block":  # nothing to block: shown to the user, as Claude Code does
                    warn(f"{ans.name}: {ans.reason}")
                    eng.decided("SessionStart", "block-ignored", ans, ans.reason)
                text = _context_of(ans)
                if text:
                    step.context.append(InboxItem(text, "context", _source(ans)))
    # A user's prompt: not a Stop hook's follow-up, not a sub-agent's task (Claude Code fires
    # UserPromptSubmit for neither).
    if not step.has_input or step.source != "user" or ctx.parent is not None or \
            not eng.settings.active("UserPromptSubmit"):
        return
    for ans in eng.fire("UserPromptSubmit", {"prompt": step.text}):
        stop = eng.stop_run(ans)
        if stop is not None:
            step.reject(f"{ans.name} stopped the run: {stop}")
            return
        if ans.kind == "block" or ans.field("decision") == "block":
            reason = ans.reason if ans.kind == "block" else str(ans.field("reason") or "")
            step.reject(f"{ans.name} blocked the prompt: {reason or '(no reason given)'}")
            warn(f"{ans.name} blocked the prompt: {reason}")
            eng.decided("UserPromptSubmit", "block", ans, reason)
            return
        text = _context_of(ans)
        if text:
            step.context.append(InboxItem(text, "context", _source(ans)))


def _context_of(ans: Answer) -> str:
    """What a UserPromptSubmit / SessionStart hook adds: plain stdout, or
    ``hookSpecificOutput.additionalContext``."""
    if ans.kind != "ok":
        return ""
    if ans.json is not None:
        extra = ans.specific.get("additionalContext")
        return str(extra) if extra else ""
    return ans.text


def _source(ans: Answer) -> str:
    # Shown to the model in <context source="…">: no double quotes inside.
    return f"hook {ans.hook.event}: {shown(ans.hook.command)}".replace('"', "'")


def pre_execute(eng: Engine, call: Any) -> None:
    if not eng.settings.active("PreToolUse"):
        return
    # Blocked by another plugin already: the hooks still run and their decision is recorded
    # (every pre_execute runs, docs/plugins.md), but nothing is asked or approved.
    already = call.blocked_by if call.blocked is not None else None
    dsh_name = call.call.name
    name, tool_input = eng.present(dsh_name, call.arguments)
    fields = {"tool_name": name, "tool_input": tool_input, "tool_use_id": call.call.id}
    answers = eng.fire("PreToolUse", fields, name, dsh_name)
    about = {"tool_name": name, "tool_use_id": call.call.id}
    notes: list[str] = []
    decision, why, by = "", "", None
    rank = {"": 0, "allow": 1, "ask": 2, "deny": 3}
    for ans in answers:
        stop = eng.stop_run(ans)
        if stop is not None:
            call.block(f"{ans.name} stopped the run: {stop}", plugin="hooks")
            return
        d, r = _permission(ans)
        if ans.kind == "error":
            notes.append(f"{ans.name}: {ans.reason} (not applied)")
        if rank[d] > rank[decision]:
            decision, why, by = d, r, ans
        updated = ans.specific.get("updatedInput")
        if isinstance(updated, Mapping) and d != "deny":
            known = set((call.tool.parameters or {}).get("properties", {})) if call.tool else None
            new = eng.back(dsh_name, updated, known)
            call.arguments.update(new)
            eng.decided("PreToolUse", "rewrite", ans, arguments=_jsonable(new), **about)
            notes.append(f"{ans.name} rewrote the arguments: "
                         f"{json.dumps(new, ensure_ascii=False, default=str)}")
    if already is not None and by is not None:
        eng.decided("PreToolUse", decision or "none", by, why, already_blocked_by=already,
                    **about)
        return
    if decision == "deny" and by is not None:
        call.block(f"{by.name}: {why or '(no reason given)'}", plugin="hooks")
        eng.decided("PreToolUse", "deny", by, why, **about)
        return
    # An approval is the run's flag (RunContext.approve_all), set while this call runs. Only
    # for a sequential tool (dsh-shell's run_command, write_file): a step with one never runs
    # its calls concurrently, so no other call sees the flag.
    sequential = call.tool is not None and call.tool.sequential
    if decision == "allow" and by is not None:
        if sequential:
            eng.approved[id(call)] = eng.ctx.approve_all
            eng.ctx.approve_all = True
        notes.append(f"{by.name} allowed the call without approval"
                     + (f": {why}" if why else "")
                     + ("" if sequential else " (a concurrent tool: approval unchanged)"))
        eng.decided("PreToolUse", "allow", by, why, approval=(
            "skipped" if sequential else "unchanged (a concurrent tool)"), **about)
    elif decision == "ask" and by is not None:
        refusal = ask_user(call, by, why)
        eng.decided("PreToolUse", "ask", by, why, approved=not refusal, **about)
        if refusal:
            call.block(refusal, plugin="hooks")
            return
        if sequential:
            eng.approved[id(call)] = eng.ctx.approve_all
            eng.ctx.approve_all = True
        notes.append(f"{by.name} asked; the user approved")
    if notes:
        eng.ctx.data.setdefault(KEY + ":notes", {})[id(call)] = notes


def _jsonable(value: Any) -> Any:
    return json.loads(json.dumps(value, ensure_ascii=False, default=str))


def _permission(ans: Answer) -> tuple[str, str]:
    if ans.kind == "block":
        return "deny", ans.reason
    if ans.kind != "ok" or ans.json is None:
        return "", ""
    spec = ans.specific
    d = spec.get("permissionDecision")
    if d in ("allow", "deny", "ask"):
        return str(d), str(spec.get("permissionDecisionReason") or "")
    legacy = ans.field("decision")  # the older top-level form: approve / block
    if legacy == "block":
        return "deny", str(ans.field("reason") or "")
    if legacy == "approve":
        return "allow", str(ans.field("reason") or "")
    return "", ""


def ask_user(call: Any, ans: Answer, why: str) -> str | None:
    """``permissionDecision: ask``: the user decides on the terminal; with ``--yes`` the run
    approved every call already. Returns the refusal, or None when approved."""
    if getattr(_ctx(), "approve_all", False):
        return None
    try:
        fd = os.open("/dev/tty", os.O_RDWR | os.O_NOCTTY | os.O_CLOEXEC)
    except OSError:
        return (f"{ans.name} asked for approval ({why or 'no reason given'}); no terminal to "
                "ask on — rerun with --yes to approve")
    from dsh.cli.render import escape_controls
    from dsh.cli.terminal import status_paused

    question = (f"\ndsh-hooks: {escape_controls(ans.name, newlines=False)} asks: allow "
                f"{call.call.name} ({escape_controls(why, newlines=False)})? [y/N] ")
    with status_paused(), os.fdopen(fd, "r+b", buffering=0) as tty:
        tty.write(question.encode(errors="replace"))
        answer = tty.readline(1024)
    if answer.strip().lower() in (b"y", b"yes"):
        return None
    return f"the user did not approve {call.call.name} ({ans.name} asked: {why})"


def _ctx() -> Any:
    from dsh.host.runcontext import current_or_none

    return current_or_none()


def after_execute(eng: Engine, call: Any) -> None:
    """Undo a hook's approval once the call is over (in the ``execute`` wrapper)."""
    before = eng.approved.pop(id(call), None)
    if before is not None:
        eng.ctx.approve_all = before


def post_execute(eng: Engine, call: Any, outcome: Any) -> None:
    notes = eng.ctx.data.get(KEY + ":notes", {}).pop(id(call), [])
    if eng.settings.active("PostToolUse") and call.blocked is None:
        dsh_name = call.call.name
        name, tool_input = eng.present(dsh_name, call.arguments)
        fields = {"tool_name": name, "tool_input": tool_input, "tool_use_id": call.call.id,
                  "tool_response": {"output": outcome.output, "status": outcome.status,
                                    "success": outcome.status == "ok"}}
        for ans in eng.fire("PostToolUse", fields, name, dsh_name):
            stop = eng.stop_run(ans)
            if stop is not None:
                notes.append(f"{ans.name} stopped the run: {stop}")
            if ans.kind == "block":
                notes.append(f"{ans.name}: {ans.reason}")
            elif ans.kind == "error":
                notes.append(f"{ans.name}: {ans.reason} (not applied)")
            elif ans.field("decision") == "block":
                notes.append(f"{ans.name}: {ans.field('reason') or '(no reason given)'}")
                eng.decided("PostToolUse", "block", ans, str(ans.field("reason") or ""),
                            tool_name=name, tool_use_id=call.call.id)
            extra = ans.specific.get("additionalContext")
            if extra:
                notes.append(f"{ans.name} adds: {extra}")
    if notes:
        # The tool result is the record (tool/result) and what the model reads (C3).
        outcome.output = outcome.output + "\n\n" + "\n".join(f"[{n}]" for n in notes)


def turn_stopping(eng: Engine, turn: Any) -> str | None:
    event = "Stop" if eng.ctx.parent is None else "SubagentStop"
    if not eng.settings.active(event):
        return None
    active = turn.number in eng.stop_active
    for ans in eng.fire(event, {"stop_hook_active": active}):
        if eng.stop_run(ans) is not None:
            return None
        if ans.kind == "block":
            reason = ans.reason
        elif ans.field("decision") == "block":
            reason = str(ans.field("reason") or "(no reason given)")
        else:
            continue
        eng.stop_active.add(turn.number)
        eng.decided(event, "continue", ans, reason, stop_hook_active=active)
        # Written as user/message (source plugin:hooks) before the request that carries it.
        return f"{ans.name} feedback:\n{reason}"
    return None


def pre_compact(eng: Engine, request: Any) -> bool:
    """Run PreCompact hooks; True when one vetoes an automatic compaction."""
    trigger = "manual" if request.reason == "manual" else "auto"
    for ans in eng.fire("PreCompact", {"trigger": trigger, "custom_instructions": ""},
                        trigger):
        blocked = ans.kind == "block" or ans.field("decision") == "block"
        if blocked and trigger == "auto":
            why = ans.reason if ans.kind == "block" else str(ans.field("reason") or "")
            warn(f"{ans.name} vetoed an automatic compaction ({request.reason}): {why}")
            eng.decided("PreCompact", "veto", ans, why, trigger=trigger, why=request.reason)
            return True
        if blocked:
            warn(f"{ans.name} cannot veto a manual compaction (ignored)")
            eng.decided("PreCompact", "veto-ignored", ans, trigger=trigger)
    return False


def session_end(eng: Engine) -> None:
    # A cleanup: it runs however the run ended, an abort included (its own timeout bounds it).
    for ans in eng.fire("SessionEnd", {"reason": "other"}, cancellable=False):
        if ans.kind == "block":
            warn(f"{ans.name}: {ans.reason}")
