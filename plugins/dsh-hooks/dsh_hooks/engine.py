"""The hooks of one run: which fire, how they run, what is recorded (docs/hooks-plugin.md).

One :class:`Engine` per run (``RunContext.data``), built when the run's agent has hooks
configured (:func:`dsh_hooks.events.begin`). :meth:`Engine.fire` runs every hook of an event
whose matcher (:func:`matches`) names the tool, in parallel, bounded by their timeouts and the
run's cancellation; its helpers record what the model does not see as plugin events
(dsh.plugin_events, issue 11): ``x/dsh-hooks/hook`` for every hook process (how it ended,
what it answered) and ``x/dsh-hooks/decision`` for what dsh did with the answers (a call
denied, allowed, asked or rewritten, a prompt blocked, a turn continued, a compaction vetoed,
the run stopped), and map tool names and arguments between dsh's and the protocol's.
The events themselves are :mod:`dsh_hooks.events`; one answer is :mod:`dsh_hooks.answers`.
"""

from __future__ import annotations

import json
import os
import re
import threading
import time
from collections.abc import Mapping
from typing import Any

import attrs

from dsh_hooks import runner
from dsh_hooks.answers import EVENT_JSON as EVENT_JSON  # re-exported
from dsh_hooks.answers import EVENT_TEXT as EVENT_TEXT  # re-exported
from dsh_hooks.answers import PLUGIN
from dsh_hooks.answers import Answer
from dsh_hooks.answers import _cut
from dsh_hooks.answers import hook_event
from dsh_hooks.answers import interpret
from dsh_hooks.answers import shown
from dsh_hooks.answers import warn
from dsh_hooks.config import MATCHED
from dsh_hooks.config import Hook
from dsh_hooks.config import HookSettings

#: ``RunContext.data`` key of the run's engine.
KEY = "dsh_hooks"


def matches(matcher: str, *names: str) -> bool:
    """Claude Code's matcher rules: empty or ``*`` match all; a plain name or ``A|B``
    alternation matches exactly; anything else is a regex searched in the name."""
    if matcher in ("", "*"):
        return True
    if re.fullmatch(r"[\w|]+", matcher):
        alternatives = matcher.split("|")
        return any(n in alternatives for n in names)
    return any(re.search(matcher, n) for n in names)


class Engine:
    """The hooks of one run of one agent."""

    def __init__(self, settings: HookSettings, ctx: Any, *, workspace: str,
                 ledger: Any = None) -> None:
        self.settings = settings
        self.ctx = ctx
        self.ledger = ledger if ledger is not None else getattr(ctx, "ledger", None)
        self.workspace = workspace
        self.env = runner.child_env(settings.env_keep, settings.project_dir)
        #: A project file's hooks: the same, less any secret ``env_keep`` let in.
        self.project_env = without_secrets(self.env)
        #: Turns continued by a Stop hook (``stop_hook_active`` on re-entry).
        self.stop_active: set[int] = set()
        #: The session rendered in Claude Code's transcript shape (:mod:`dsh_hooks.transcript`),
        #: made at the first hook that gets ``transcript_path``; None before or without a file.
        self.transcript: Any = None
        #: What SessionStart hooks set through ``CLAUDE_ENV_FILE`` (:mod:`dsh_hooks.envfile`).
        self.session_env: dict[str, str] = {}
        #: Project hooks the kernel could not confine this run (said once, then skipped):
        #: ``(command, plugin root, source) → why``.
        self.unconfinable: dict[tuple[str, str, str], str] = {}
        self._transcript_lock = threading.Lock()

    def close(self) -> None:
        """The run is over: its transcript rendering is removed."""
        if self.transcript is not None:
            self.transcript.close()
            self.transcript = None

    def transcript_path(self) -> str:
        """The rendering of the session, brought up to date with the ledger; "" without a
        session file (``--no-save``, ``dsh hooks test``)."""
        ledger = self.ledger
        path = getattr(ledger, "path", None) if ledger is not None else None
        if not path:
            return ""
        with self._transcript_lock:
            if self.transcript is None:
                from dsh_hooks.transcript import Transcript

                try:
                    self.transcript = Transcript(str(path), ledger.session_id,
                                                 self.settings.project_dir)
                except OSError as exc:
                    warn(f"cannot render the transcript for hooks: {exc}")
                    return ""
        return str(self.transcript.sync())

    # ---------------------------------------------------------------- firing

    def base(self, event: str) -> dict[str, Any]:
        ctx, ledger = self.ctx, self.ledger
        return {
            "session_id": ledger.session_id if ledger is not None else "",
            "transcript_path": self.transcript_path(),
            "cwd": self.settings.project_dir,
            "hook_event_name": event,
            "permission_mode": permission_mode(ctx),
        }

    def fire(self, event: str, fields: Mapping[str, Any], *names: str,
             cancellable: bool = True, env: Mapping[str, str] | None = None) -> list[Answer]:
        """Run every hook of ``event`` whose matcher matches one of ``names`` (all of them
        for events without matchers), in parallel; answers in configuration order.

        Each hook's wait is bounded by its ``timeout`` and, when ``cancellable``, by the run's
        cancellation: an abort kills every hook process of the event at once, the answers
        are recorded, and :class:`~dsh.core.errors.Cancelled` is raised so the run ends now.
        ``env``: variables added to these hooks' environment (``CLAUDE_ENV_FILE``)."""
        hooks = self.settings.active(event)
        if event in MATCHED:
            hooks = [h for h in hooks if matches(h.matcher, *names)]
        seen: set[tuple[str, str]] = set()
        unique = []
        for h in hooks:  # identical commands run once, as the protocol does
            if (h.command, h.plugin_root) not in seen:
                seen.add((h.command, h.plugin_root))
                unique.append(h)
        if not unique:
            return []
        base = self.base(event)
        payload = json.dumps({**base, **fields}, ensure_ascii=False, default=str).encode()
        cap = self.settings.max_output
        cancel = getattr(self.ctx, "cancel", None) if cancellable else None

        def one(h: Hook) -> Answer:
            env_h = {**(self.project_env if h.from_project else self.env), **(env or {})}
            if h.plugin_root:
                env_h["CLAUDE_PLUGIN_ROOT"] = h.plugin_root
            key = (h.command, h.plugin_root, h.source)
            if key in self.unconfinable:  # refused earlier in this run: said once already
                why = self.unconfinable[key]
                return Answer(h, "error", why, ran=runner.Ran("spawn", None, "", why, 0.0,
                                                              unconfinable=why))
            policy = with_files(h.policy, base["transcript_path"], env_h.get("CLAUDE_ENV_FILE"))
            ran = runner.run(h.command, payload, timeout=h.timeout, cwd=self.settings.project_dir,
                             env=env_h, max_output=cap, cancel=cancel, policy=policy)
            if ran.unconfinable and h.from_project:
                return self.skipped(h, ran)
            try:
                return interpret(h, ran, cap)
            except Exception as exc:  # an answer dsh failed to read may be a deny: fail closed
                why = f"its answer could not be read ({type(exc).__name__}): treated as a block"
                warn(f"{h.event} hook `{shown(h.command)}` ({h.source}): {why}")
                return Answer(h, "block", why, ran=ran)

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

    def skipped(self, h: Hook, ran: runner.Ran) -> Answer:
        """A project hook the kernel could not confine did not run, and does not run again
        this run: one line on stderr says so, and how to run that source unconfined."""
        table, _, source = h.policy.where.rpartition(" sandbox.")
        inner = re.search(r"\((.*)\); it was not run", ran.unconfinable)
        why = (f"skipped: the sandbox is unavailable "
               f"({inner.group(1) if inner else ran.unconfinable}); a project hook never runs "
               f"unconfined (to run them unconfined: [{table}] sandbox = "
               f"{{ {source} = \"off\" }})")
        self.unconfinable[(h.command, h.plugin_root, h.source)] = why
        warn(f"{h.event} hook `{shown(h.command)}` ({h.source}): {why}")
        return Answer(h, "error", why, ran=attrs.evolve(ran, stderr=why))

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
                # What the model wrote, made absolute but NOT normalised: a hook's own
                # ``..`` check must see the ``..`` (dsh-shell still refuses the escape).
                value = os.path.join(self.workspace, value)
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


def with_files(policy: Any, transcript: str, env_file: str | None) -> Any:
    """``policy`` (None: unconfined) letting the hook read the session's transcript and write
    its ``CLAUDE_ENV_FILE``, both in private directories of this run outside the project."""
    if policy is None:
        return None
    read = (os.path.dirname(transcript),) if transcript else ()
    write = ((os.path.dirname(env_file),) if env_file and policy.mode == "workspace-write"
             else ())
    if not read and not write:
        return policy
    return attrs.evolve(policy, read=(*policy.read, *read), write=(*policy.write, *write))


def without_secrets(env: Mapping[str, str]) -> dict[str, str]:
    """``env`` less what a project file's hook never gets, whatever ``env_keep`` lets in:
    variables named as credentials (``*_API_KEY``, ``*TOKEN*``…), values dsh's redaction would
    hide (a provider key's shape) and dsh's own variables (``DSH_*`` but the project's)."""
    from dsh.core.redact import credential_name
    from dsh.core.redact import redact

    return {k: v for k, v in env.items()
            if k == "DSH_PROJECT_DIR" or not (
                credential_name(k) or k.startswith("DSH_") or redact(v) != v)}


def _where(info: Any) -> str:
    own = info.settings.get("plugin_settings", {}).get("hooks")
    return f"agents.{info.name}.plugin_settings.hooks" if own else "plugins.hooks"


#: The event functions this module held before they moved to :mod:`dsh_hooks.events` (which
#: imports this module): still importable from here, imported when asked for.
_IN_EVENTS = frozenset({"begin", "for_compaction", "pre_step", "pre_execute", "ask_user",
                        "after_execute", "post_execute", "turn_stopping", "pre_compact",
                        "session_end"})


def __getattr__(name: str) -> Any:
    if name in _IN_EVENTS:
        from dsh_hooks import events

        return getattr(events, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


#: Claude Code's name for each dsh permission mode (``permission_mode`` in a hook's input).
_CLAUDE_MODES = {"read-only": "plan", "plan": "plan", "ask": "default",
                 "auto-edit": "acceptEdits", "full-auto": "acceptEdits"}


def permission_mode(ctx: Any) -> str:
    """``bypassPermissions`` under ``--yes``, else Claude Code's name for the run's mode."""
    if getattr(ctx, "approve_all", False):
        return "bypassPermissions"
    return _CLAUDE_MODES.get(getattr(ctx, "mode", "ask"), "default")
