"""Plan mode (``--mode plan``; docs/security.md, "Permission modes and approvals"): the agent
reads and plans, changes nothing, and proposes its plan with the ``propose_plan`` tool; the
person approves it and picks the mode the rest of the session runs in, or sends it back.

The tool is offered only to an agent whose own mode is ``plan``. Its decision is an
``x/dsh.tools/approval`` event (tool ``propose_plan``, action ``plan``); the mode chosen is
written on the next ``turn/start`` and governs every later call of the session. Without a
terminal no one can approve: the tool says so, and the model answers with its plan (which
``dsh run --mode plan`` prints). A sub-agent cannot leave plan mode.
"""

from __future__ import annotations

import os
from typing import Any

from dsh.tools.registry import ToolDef

NAME = "propose_plan"
#: The answers to the question, and the mode each one approves the plan for.
CHOICES = {"a": "ask", "e": "auto-edit", "f": "full-auto"}
_LINES = 60


def plan_tool() -> ToolDef:
    """The ``propose_plan`` tool of a plan-mode agent."""
    return ToolDef(
        name=NAME,
        description="Plan mode: nothing may change yet. When you have read enough, call this "
        "with your plan (Markdown, the steps you will take); the person approves it (then "
        "you may carry it out) or tells you what to change.",
        parameters={"type": "object", "properties": {"plan": {
            "type": "string", "description": "the plan, in Markdown"}},
            "required": ["plan"], "additionalProperties": False},
        fn=propose_plan, plugin="dsh.tools", sequential=True,
    )


def propose_plan(plan: str) -> str:
    from dsh.core.errors import ToolError
    from dsh.host.runcontext import context
    from dsh.tools import approval

    ctx = context()
    if ctx.mode != "plan":
        raise ToolError(f"the plan is approved already (the mode is {ctx.mode}); carry it out")
    ask = approval.Ask(tool=NAME, action="plan", subject=plan[:2000], root=os.getcwd(),
                       detail=plan)
    if ctx.parent is not None:
        decision = approval.Decision(False, "mode", "a sub-agent cannot leave plan mode; "
                                     "give your plan as your answer")
    elif ctx.approve_all:
        decision = approval.Decision(True, "yes", "--yes approved every call of this run; "
                                     "mode ask")
    elif (asker := approval.asker_for(ctx)) is not None:
        # The run's own asker (an editor, a server with no one to ask): never the terminal.
        # Its decision may end its ``why`` with ``; mode auto-edit`` (or full-auto) to pick
        # the mode the plan is approved for; else ask.
        decision = approval.asked(asker, ask)
    else:
        decision = _ask(plan, ctx)
    mode = next((m for m in CHOICES.values() if decision.why.endswith(f"; mode {m}")), "ask")
    approval.note(ask, decision)
    if not decision.allowed:
        raise ToolError(f"the plan was not approved: {decision.why}; nothing may change yet")
    ctx.mode = mode
    if ctx.session is not None:
        ctx.session.planned_mode = mode
    return f"The person approved the plan. The permission mode is now {mode}: carry it out."


def _ask(plan: str, ctx: Any) -> Any:
    from dsh.core.escape import escape_controls
    from dsh.tools import approval

    lines = ["dsh: the agent proposes this plan:"]
    shown = plan.splitlines()
    for line in shown[:_LINES]:
        lines.append("  " + escape_controls(line, newlines=False))
    if len(shown) > _LINES:
        lines.append(f"  … ({len(shown) - _LINES} more lines)")
    lines.append("[a] approve, ask before each change  [e] approve, edits run (auto-edit)  "
                 "[f] approve, everything in the sandbox runs (full-auto)  [n] keep planning  "
                 "[r] keep planning, and say what to change: ")
    try:
        choice, reason, ended = approval.prompt(lines, ctx)
    except OSError:
        return approval.Decision(False, "no-terminal", "there is no terminal on which the "
                                 "person could approve a plan; give the plan as your answer")
    if ended:
        return approval.Decision(False, "no-answer", f"no answer about the plan before {ended}")
    if choice in CHOICES:
        return approval.Decision(True, "person", f"the person approved the plan; "
                                 f"mode {CHOICES[choice]}")
    if choice == "r" and reason:
        return approval.Decision(False, "person", f"the person wants the plan changed: "
                                 f"{reason[:1000]}")
    return approval.Decision(False, "person", "the person did not approve the plan; ask "
                             "them what to change")
