"""The protocol's events mapped onto dsh's hooks (docs/hooks-plugin.md has the table).

:func:`begin` builds a run's :class:`~dsh_hooks.engine.Engine` at its first step
(:func:`for_compaction` one for ``dsh sessions compact``); the functions below are what the
plugin's hook implementations call: SessionStart and UserPromptSubmit at ``pre_step``,
PreToolUse and PostToolUse around ``execute``, Stop / SubagentStop at ``turn_stopping``,
PreCompact at ``compact_context``, SessionEnd as a run cleanup. Everything a hook adds that
the model will read goes through a path dsh records before the request that carries it (C3):
injected context (``context/injected``, its ``source`` naming the event and the command), the
tool result (``tool/result``), the step's rejection (``step/rejected``) or the follow-up
message (``user/message``).
"""

from __future__ import annotations

import json
import os
import threading
import weakref
from collections.abc import Mapping
from typing import Any

from dsh_hooks.answers import Answer
from dsh_hooks.answers import shown
from dsh_hooks.answers import warn
from dsh_hooks.engine import KEY
from dsh_hooks.engine import Engine
from dsh_hooks.engine import _where

#: Ledgers (open sessions) this process has already started: SessionStart fires once each.
_started: weakref.WeakSet[Any] = weakref.WeakSet()
#: What SessionStart hooks set through CLAUDE_ENV_FILE, per open session: later runs of the
#: same session in this process (`dsh chat`'s next turns) give it to their commands too.
_session_envs: weakref.WeakKeyDictionary[Any, dict[str, str]] = weakref.WeakKeyDictionary()
_started_lock = threading.Lock()


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
    # Cleanups run last-added first: SessionEnd still gets the transcript, then it goes.
    turn.ctx.add_cleanup(eng.close)
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


# -------------------------------------------------------------------- the events


def pre_step(eng: Engine, step: Any) -> None:
    from dsh.run.loop import InboxItem

    ctx = eng.ctx
    if step.index == 0 and ctx.parent is None:
        with _started_lock:
            first = ctx.ledger not in _started
            _started.add(ctx.ledger)
        if not first and ctx.ledger in _session_envs:
            from dsh_hooks.envfile import SESSION_ENV

            ctx.data[SESSION_ENV] = dict(_session_envs[ctx.ledger])
        if first and eng.settings.active("SessionStart"):
            source = "startup" if ctx.ledger.projection.turn <= 1 else "resume"
            for ans in session_start(eng, source):
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


def session_start(eng: Engine, source: str) -> list[Answer]:
    """Fire SessionStart with a fresh ``CLAUDE_ENV_FILE``; what its hooks wrote there joins
    the environment of dsh-shell's commands, recorded first (:mod:`dsh_hooks.envfile`)."""
    from dsh_hooks import envfile

    try:
        directory, path = envfile.create()
    except OSError as exc:
        warn(f"cannot create CLAUDE_ENV_FILE: {exc}; SessionStart hooks run without it")
        return eng.fire("SessionStart", {"source": source}, source)
    try:
        answers = eng.fire("SessionStart", {"source": source}, source,
                           env={"CLAUDE_ENV_FILE": path})
        found, refused = envfile.read(path, dict(eng.env))
    finally:
        envfile.remove(directory)
    for why in refused:
        warn(f"CLAUDE_ENV_FILE of SessionStart hooks: {why}")
    if found or refused:
        eng.record("env", {"source": source, "set": found, "refused": refused})
    eng.session_env.update(found)
    if found and eng.ctx is not None:
        env = dict(eng.ctx.data.get(envfile.SESSION_ENV) or {})
        env.update(found)
        eng.ctx.data[envfile.SESSION_ENV] = env
        if eng.ctx.ledger is not None:
            _session_envs[eng.ctx.ledger] = env
    return answers


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
        # Ties go to the first hook, except that a user's own allow outranks a project
        # file's (which approves nothing): the call is then approved by the user's hook.
        if rank[d] > rank[decision] or (d == decision == "allow" and by is not None
                                        and by.hook.from_project
                                        and not ans.hook.from_project):
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
    # A user's own hook approves through the approval service (recorded "by hook"); it
    # cannot widen the mode, and a project's hook cannot approve at all.
    from dsh.tools import approval

    if decision == "allow" and by is not None and by.hook.from_project:
        # A project file may narrow what runs (deny, ask), never widen it: dsh's own approval
        # rules decide the call, as if the hook had said nothing.
        notes.append(f"{by.name} ({by.hook.source}) allowed the call; a project hook cannot "
                     "approve one: dsh's approval rules apply")
        eng.decided("PreToolUse", "allow", by, why, approval="unchanged (a project hook)",
                    **about)
    elif decision == "allow" and by is not None:
        approval.preapprove(call, "hook", f"{by.name} allowed it" + (f": {why}" if why else ""))
        notes.append(f"{by.name} allowed the call without approval"
                     + (f": {why}" if why else ""))
        eng.decided("PreToolUse", "allow", by, why, approval="skipped", **about)
    elif decision == "ask" and by is not None:
        refusal = ask_user(call, by, why)
        eng.decided("PreToolUse", "ask", by, why, approved=not refusal, **about)
        if refusal:
            call.block(refusal, plugin="hooks")
            return
        if by.hook.from_project:  # it asked; dsh's own approval still follows
            notes.append(f"{by.name} asked; the user approved (dsh's approval rules apply: "
                         "a project hook)")
        else:
            approval.preapprove(call, "person", f"the person approved it ({by.name} asked)")
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


def blocks(event: str, ans: Answer) -> str | None:
    """The reason when a run would read ``ans`` as a block of ``event`` (exit 2; for
    PreToolUse a ``deny`` decision, JSON or legacy; for the events that take one a
    top-level ``decision: block``), else None. Used by ``dsh hooks test``."""
    if ans.kind == "block":
        return ans.reason or "(no reason given)"
    if event == "PreToolUse":
        d, r = _permission(ans)
        return (r or "(no reason given)") if d == "deny" else None
    if event in ("PostToolUse", "UserPromptSubmit", "Stop", "SubagentStop", "PreCompact") \
            and ans.field("decision") == "block":
        return str(ans.field("reason") or "(no reason given)")
    return None


def ask_user(call: Any, ans: Answer, why: str) -> str | None:
    """``permissionDecision: ask``: the person decides, through dsh's approval question (a
    grant for this tool, or ``--yes``, answers it already; with no terminal it is a no).
    Returns the refusal, or None when approved."""
    from dsh.tools import approval

    ctx = _ctx()
    if getattr(ctx, "approve_all", False):
        return None
    args = json.dumps(call.arguments, ensure_ascii=False, default=str)
    ask = approval.Ask(tool=call.call.name, action="command", subject=args[:2000],
                       root=os.getcwd(), reason=f"{ans.name} asks: {why or 'no reason given'}",
                       verb="call", always="tool", program=call.call.name)
    decision = (approval.granted(ask, ctx) if ctx is not None else None) \
        or approval.question(ask, ctx)
    if decision.allowed:
        return None
    if decision.by == "no-terminal":
        return (f"{ans.name} asked for approval ({why or 'no reason given'}); no terminal to "
                "ask on — rerun with --yes to approve")
    return f"the user did not approve {call.call.name} ({ans.name} asked: {why}): {decision.why}"


def _ctx() -> Any:
    from dsh.host.runcontext import current_or_none

    return current_or_none()


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
