"""Sub-agents (MISSION D6, D8): the ``ask_CHILD`` tool that runs another agent as a nested run.

:func:`subagent_tool` builds the tool an agent with ``subagents = [...]`` gets for each child:
it runs the child in a session of its own, created under the id the tool call chose, with
the parent run's cancellation and a budget chained to the parent's; :func:`check_subagent`
refuses a child that is not a configured agent. A child session's first ``turn/start`` names
its parent session and call (:func:`_parent_link`), and runs nest at most :data:`MAX_DEPTH`
deep.
"""

from __future__ import annotations

from typing import TYPE_CHECKING
from typing import Any

from dsh.core.errors import UsageError
from dsh.host.runcontext import RunContext
from dsh.tools.registry import ToolDef

if TYPE_CHECKING:
    from dsh.run.app import App

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
                                  approve=parent.approve_all)
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
