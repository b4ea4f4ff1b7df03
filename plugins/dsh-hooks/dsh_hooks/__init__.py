"""dsh-hooks: hook scripts written for Claude Code's command-hook protocol, run unchanged.

Installed, dsh imports this module on every start-up, so it holds only the hook
implementations; the engine (:mod:`dsh_hooks.events` — the protocol's events —,
:mod:`dsh_hooks.engine` and :mod:`dsh_hooks.answers`: subprocesses, JSON, threads) is
imported when a run's agent has hooks configured. With none, each hook below returns after a
dictionary lookup. Settings: ``[plugins.hooks]`` overlaid with
``[agents.NAME.plugin_settings.hooks]`` (docs/hooks-plugin.md).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from dsh.hookspecs import hookimpl
from dsh.host.runcontext import current_or_none

if TYPE_CHECKING:
    import click

    from dsh.run.app import App
    from dsh.run.compaction import Compaction
    from dsh.run.compaction import CompactionRequest
    from dsh.run.loop import StepDraft
    from dsh.run.loop import Turn
    from dsh.tools.registry import ToolInvocation
    from dsh.tools.registry import ToolOutcome
    from dsh_hooks.engine import Engine

__version__ = "0.1.0"
KEY = "dsh_hooks"  # RunContext.data key of the run's engine (dsh_hooks.engine.KEY)


def _engine() -> Engine | None:
    """The run's engine: built by :func:`_start` at its first step; None without hooks."""
    ctx = current_or_none()
    return ctx.data.get(KEY) if ctx is not None else None


def _start(turn: Turn | None) -> Engine | None:
    """At the run's first ``pre_step`` (or ``turn_stopping``, for a turn without input):
    build the run's engine when the agent has hooks, else remember there are none."""
    ctx = current_or_none()
    if ctx is None:
        return None
    if KEY in ctx.data:
        return ctx.data[KEY]
    ctx.data[KEY] = None
    raw = turn.agent.info.plugin_settings("hooks") if turn is not None else None
    if raw:
        from dsh_hooks import events

        events.begin(turn, raw)  # stores the engine in ctx.data
    return ctx.data[KEY]


@hookimpl
def configure(app: App) -> None:
    """Validate the TOML tables at assembly (no I/O: settings files are read per run)."""
    cfg = app.config
    tables = [("plugins.hooks", cfg.plugin_settings("hooks"))] + [
        (f"agents.{name}.plugin_settings.hooks", a.plugin_settings["hooks"])
        for name, a in cfg.agents.items() if "hooks" in a.plugin_settings]
    if any(raw for _, raw in tables):
        from dsh_hooks import config

        for where, raw in tables:
            config.check(raw, where)


# No run_turn implementation and no wrapper around the turn or the tool chain: a plain
# run_turn would count as replacing the agent loop (dsh checks one exists), and a wrapper's
# frame would sit in the traceback of every error of the turn, which dsh attributes to the
# plugin whose code is deepest in it. The engine is built at the run's first step instead.


@hookimpl
def pre_step(step: StepDraft) -> None:
    eng = _start(step.turn)
    if eng is not None:
        from dsh_hooks import events

        events.pre_step(eng, step)


@hookimpl
def pre_execute(call: ToolInvocation) -> None:
    eng = _engine()
    if eng is not None:
        from dsh_hooks import events

        events.pre_execute(eng, call)


@hookimpl
def post_execute(call: ToolInvocation, outcome: ToolOutcome) -> None:
    eng = _engine()
    if eng is not None:
        from dsh_hooks import events

        events.post_execute(eng, call, outcome)


@hookimpl
def turn_stopping(turn: Turn) -> str | None:
    eng = _start(turn)
    if eng is None:
        return None
    from dsh_hooks import events

    return events.turn_stopping(eng, turn)


@hookimpl(tryfirst=True)
def compact_context(request: CompactionRequest) -> Compaction | None:
    """PreCompact: hooks run before any strategy does. A veto of an automatic compaction
    turns the strategy off for this call (``request.strategy`` becomes a name no strategy
    answers to, so no summary is written). Always returns None: the strategies decide."""
    if request.agent.info.plugin_settings("hooks"):
        from dsh_hooks import events

        eng = events.for_compaction(request)
        try:
            if eng is not None and eng.settings.active("PreCompact") and events.pre_compact(
                    eng, request):
                request.strategy = "off (vetoed by a PreCompact hook)"
        finally:
            if eng is not None and eng.ctx is None:  # `dsh sessions compact`: no run to end
                eng.close()
    return None


@hookimpl
def register_commands(cli: click.Group) -> None:
    from dsh_hooks.commands import hooks

    cli.add_command(hooks)
