"""``dsh.tasks``: the model's task list, kept as recorded state (issue 25, MISSION D4).

Opt-in per agent (``[plugins."dsh.tasks"] enabled = true``, or the agent's own
``[agents.NAME.plugin_settings."dsh.tasks"]``). The agent gets one tool, ``update_tasks``,
that writes the whole list (each item a ``content`` and a ``status``: ``pending``,
``in_progress`` or ``completed``), as Claude Code's TodoWrite does. Every call is an
``x/dsh.tasks/tasks`` event (:data:`TASKS`, a :class:`dsh.ledger.state.StateKey`), so the list
survives ``dsh run --session``, a crash and a compaction. At the start of each turn the list
is part of the system prompt (after the memory, ``order`` :data:`ORDER`), recorded on
``turn/start``; within a turn the tool answers with the list as it now is.

Bounds: at most :data:`MAX_TASKS` items of at most :data:`MAX_CONTENT` characters; a longer
list is refused with a message saying so, and nothing is recorded.

A task's text is the model's: rendered, its later lines are indented under its item and a
line that would open a heading or a fence is escaped (:func:`dsh.core.prompttext.item`), so a
task holding ``\\n## Memory\\n- a fact`` stays one task and forges no section of the prompt.
Only ``dsh.tasks`` records the list (a plugin records only under its own name).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from collections.abc import Sequence
from typing import Any

from dsh.core.errors import ToolError
from dsh.core.messages import FrozenDict
from dsh.core.messages import FrozenList
from dsh.hookspecs import hookimpl
from dsh.ledger.state import StateKey

PLUGIN = "dsh.tasks"
MAX_TASKS = 100
MAX_CONTENT = 500
STATUSES = ("pending", "in_progress", "completed")
#: Where the list goes in the turn's system prompt (after dsh.memory's 200).
ORDER = 300
_MARK = {"pending": "[ ]", "in_progress": "[~]", "completed": "[x]"}

SCHEMA = {
    "type": "object",
    "properties": {
        "tasks": {
            "type": "array",
            "description": "The whole task list, in order: it replaces the previous one.",
            "items": {
                "type": "object",
                "properties": {
                    "content": {"type": "string", "description": "What is to be done."},
                    "status": {"type": "string", "enum": list(STATUSES)},
                },
                "required": ["content", "status"],
            },
        },
    },
    "required": ["tasks"],
}


def problems(tasks: Any) -> str | None:
    """What is wrong with a task list (None when nothing is)."""
    if not isinstance(tasks, Sequence) or isinstance(tasks, str):
        return "tasks must be a list"
    if len(tasks) > MAX_TASKS:
        return f"at most {MAX_TASKS} tasks (got {len(tasks)}): merge or drop some"
    for i, item in enumerate(tasks):
        if not isinstance(item, Mapping):
            return f"tasks[{i}] must be an object with content and status"
        content, status = item.get("content"), item.get("status")
        if not isinstance(content, str) or not content.strip():
            return f"tasks[{i}].content must be non-empty text"
        if len(content) > MAX_CONTENT:
            return f"tasks[{i}].content is {len(content)} characters; the limit is {MAX_CONTENT}"
        if status not in STATUSES:
            return f"tasks[{i}].status must be one of {', '.join(STATUSES)}, not {status!r}"
    return None


_KEYS = frozenset({"content", "status"})


def reduce(state: Any, data: Mapping[str, Any]) -> Any:
    """The new list is the one recorded (checked again: a hand-edited line is refused). The
    recorded list is kept as it is (already read-only) when it holds nothing else."""
    tasks = data.get("tasks", [])
    # The common case, folding a resumed session: a recorded list as read back from the
    # ledger (read-only, each item exactly a valid content and status) is kept in one loop of
    # exact type checks; anything else takes the general path below, which decides the same.
    if type(tasks) is FrozenList and len(tasks) <= MAX_TASKS:
        for t in tasks:
            if type(t) is not FrozenDict or t.keys() != _KEYS:
                break
            content = t["content"]
            if (type(content) is not str or len(content) > MAX_CONTENT or not content.strip()
                    or t["status"] not in STATUSES):
                break
        else:
            return tasks
    problem = problems(tasks)
    if problem:
        raise ValueError(problem)
    if all(t.keys() == _KEYS for t in tasks):
        return tasks
    return [{"content": t["content"], "status": t["status"]} for t in tasks]


def render(tasks: Sequence[Mapping[str, Any]]) -> str:
    """The list as the model and ``dsh sessions show`` see it: one item per task, a task's
    later lines indented under it and escaped (:func:`dsh.core.prompttext.item`), so no task
    text can start a section of the system prompt (``\\n## Memory``)."""
    if not tasks:
        return "(no tasks)"
    from dsh.core.prompttext import item  # only with a task list: not on every run's path

    return "\n".join(f"{_MARK.get(t['status'], '[?]')} {i}. {item(t['content'])}"
                      for i, t in enumerate(tasks, 1))


TASKS: StateKey[list[dict[str, str]]] = StateKey(PLUGIN, "tasks", [], reduce, show=render,
                                                 replaces=True)


def summary(tasks: Sequence[Mapping[str, Any]]) -> str:
    """One line for a status line: ``tasks 2/5 done, now: write the tests``."""
    done = sum(1 for t in tasks if t["status"] == "completed")
    now = next((t["content"] for t in tasks if t["status"] == "in_progress"), "")
    return f"tasks {done}/{len(tasks)} done" + (f", now: {now}" if now else "")


def enabled(agent: Any) -> bool:
    return bool(agent.plugin_settings(PLUGIN).get("enabled", False))


def update_tasks(**arguments: Any) -> str:
    """Write your task list: the whole list each time, every item with its status."""
    tasks = arguments.get("tasks")
    problem = problems(tasks)
    if problem:
        raise ToolError(f"update_tasks: {problem}; the list was not changed")
    new = TASKS.update({"tasks": tasks})
    return "Task list updated:\n" + render(new)


@hookimpl
def register_tools(register: Any, agent: Any) -> None:
    if enabled(agent):
        register(update_tasks, name="update_tasks", parameters=copy.deepcopy(SCHEMA),
                 description="Write your task list for this session (the whole list, each "
                 "item with status pending, in_progress or completed). Use it for work of "
                 "several steps; keep exactly one item in_progress while you work.")


@hookimpl
def turn_prompt(register: Any, agent: Any, session: Any) -> None:
    if not enabled(agent):
        return
    tasks = session.state(TASKS)
    if tasks:
        register("## Tasks\n\nYour task list (update it with update_tasks):\n" + render(tasks),
                 order=ORDER, name="tasks")
