"""Sub-agents (MISSION D6, D8): the ``ask_CHILD`` tool that runs another agent as a nested run.

:func:`subagent_tool` builds the tool an agent with ``subagents = [...]`` gets for each child:
it runs the child in a session of its own, created under the id the tool call chose, with
the parent run's cancellation and a budget chained to the parent's; :func:`check_subagent`
refuses a child that is not a configured agent. A child session's first ``turn/start`` names
its parent session and call (:func:`_parent_link`), and runs nest at most :data:`MAX_DEPTH`
deep.

A sub-agent's events are its own session's: they never reach the parent run's ``on_event``,
``observe_event`` plugins or ``--events``. Who wants to see them live (``dsh run``'s lines on a
terminal) asks with :func:`watch_subagents`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING
from typing import Any

from dsh.core.errors import UsageError
from dsh.host.runcontext import RunContext
from dsh.host.stash import StashKey
from dsh.tools.registry import ToolDef

if TYPE_CHECKING:
    from dsh.run.app import App

#: ``callback(event, agent, depth)``: see :func:`watch_subagents`.
SubagentWatcher = Callable[[Any, str, int], None]
_WATCHERS: StashKey[tuple[SubagentWatcher, ...]] = StashKey()

MAX_DEPTH = 8
#: ``model = "inherit"``: as a sub-agent, the parent agent's model (else the default model).
INHERIT = "inherit"


def _parent_link(parent: RunContext | None, turn: int) -> dict[str, Any]:
    """``parent``/``parent_call`` of a child session's first turn (links both ways)."""
    if parent is None or turn != 1:
        return {}
    from dsh.tools.registry import current_call

    try:
        call_id: str | None = current_call().call.id
    except LookupError:
        call_id = None
    return {"parent": parent.session_id, "parent_call": call_id}


def watch_subagents(ctx: RunContext, callback: SubagentWatcher) -> None:
    """``callback(event, agent, depth)`` receives every event, persistent and live, of the
    sub-agents ``ctx``'s run starts from now on, and of theirs, as they happen: ``agent`` the
    sub-agent's name, ``depth`` 1 for a child, 2 for a grandchild…; ``event.session`` is the
    sub-agent's session. A sub-agent is observed (builds live events, streams) only when
    someone watches it.

    It is called from the sub-agents' threads: sub-agents run side by side when a step
    calls several, so ``callback`` may be called from several threads at once (each
    sub-agent's events in their order) and must guard its own state."""
    ctx.stash[_WATCHERS] = (*ctx.stash.get(_WATCHERS, ()), callback)


def _watchers(ctx: RunContext | None) -> tuple[SubagentWatcher, ...]:
    """The callbacks watching the sub-agents of ``ctx``'s run: its own and its ancestors'."""
    found: tuple[SubagentWatcher, ...] = ()
    while ctx is not None:
        found += ctx.stash.get(_WATCHERS, ())
        ctx = ctx.parent
    return found


def _forward(parent: RunContext, child: str) -> Callable[[Any], None] | None:
    """The child run's ``on_event``: its events to the watchers, tagged with its name and
    depth; ``None`` (the child unobserved, D7) when nobody watches."""
    watchers = _watchers(parent)
    if not watchers:
        return None
    depth = parent.depth + 1

    def forward(event: Any) -> None:
        for watcher in watchers:
            watcher(event, child, depth)

    return forward


def check_subagent(app: App, agent: str, child: str) -> None:
    """``child`` of ``[agents.AGENT] subagents`` is a configured agent."""
    names = app.config.agent_names()
    if child not in names:
        from dsh.config.loader import unknown_name
        from dsh.core.errors import ConfigError

        raise ConfigError(f"{app.config.source or 'config'}: key 'agents.{agent}.subagents': "
                          + unknown_name("agent", child, names, "configured"))


def subagent_tool(app: App, child: str, parent_model: str | None = None) -> ToolDef:
    """The ``ask_CHILD`` tool: runs agent ``child`` in a nested run with a chained budget;
    a child whose ``model`` is ``"inherit"`` runs on ``parent_model``."""
    if child not in app.config.agent_names():
        raise UsageError(f"sub-agent {child!r} is not a configured agent "
                         f"(configured: {', '.join(app.config.agent_names())})")
    description = app.config.agent_config(child).description or f"Ask the {child} agent."
    inherit = app.config.agent_config(child).model == INHERIT and parent_model is not None

    def ask(prompt: str) -> str:
        from dsh.core.errors import ToolError
        from dsh.host.runcontext import context
        from dsh.tools.registry import current_call

        parent = context()
        agent = app.agent(child, model=parent_model) if inherit else app.agent(child)
        with app.open_session(agent, current_call().child_session, create=True) as session:
            result = session.send(prompt, parent=parent, cancel=parent.cancel,
                                  approve=parent.approve_all,
                                  on_event=_forward(parent, child))
        if result.outcome in ("error", "aborted", "rejected"):
            raise ToolError(f"sub-agent {child} ended with {result.outcome}: {result.reason}")
        if result.outcome == "budget":
            # Its run could not reserve a step, request or tool call in the chain (D8).
            if not result.output:
                raise ToolError(f"sub-agent {child} stopped by a budget limit before "
                                f"answering: {result.reason}")
            return (f"{result.output}\n[sub-agent {child} stopped by a budget limit: "
                    f"{result.reason}]")
        return result.output

    return ToolDef(
        name=f"ask_{child}", description=description,
        parameters={"type": "object", "properties": {"prompt": {
            "type": "string", "description": f"what to ask the {child} agent"}},
            "required": ["prompt"], "additionalProperties": False},
        fn=ask, plugin="dsh.subagents", subagent=child,
    )
