"""dsh's events as ACP ``session/update`` payloads: a tool call's kind, title and locations,
its result with ``diff`` content rebuilt from the recorded change, and a session's history
replayed from its ledger (``session/load``).

The diffs are the ones the tool recorded on its ``tool/result`` (``changes``). A file that
still holds what the tool wrote (its SHA-256 is the change's ``after_sha256``) gives the whole
new text, and the recorded diff undone gives the whole old text; otherwise the texts are the
diff's hunks (the lines around each change), never a guess. A path is shown only when it lies
inside the session's workspace.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable
from collections.abc import Iterator
from typing import Any
from typing import Literal

from acp import schema

#: Characters of a tool's output sent as the call's content (the ledger keeps it whole).
MAX_OUTPUT = 20_000
#: Bytes of a file read to rebuild a diff's texts.
MAX_FILE = 2 * 1024 * 1024

_KINDS = {
    "read": ("read_file", "list_dir", "job_output", "view"),
    "edit": ("write_file", "edit_file", "multi_edit", "apply_patch"),
    "search": ("grep", "glob", "search", "find"),
    "execute": ("run_command", "job_kill", "bash", "shell"),
    "fetch": ("web_fetch", "fetch", "web_search"),
    "think": ("update_tasks", "propose_plan"),
}
_PATH_KEYS = ("path", "file", "file_path", "filename")


def tool_kind(name: str) -> str:
    """The ACP kind of a dsh tool, from its name (``other`` when nothing fits)."""
    for kind, names in _KINDS.items():
        if name in names:
            return kind
    low = name.lower()
    for word, kind in (("delete", "delete"), ("remove", "delete"), ("move", "move"),
                       ("rename", "move"), ("read", "read"), ("write", "edit"),
                       ("edit", "edit"), ("search", "search"), ("grep", "search"),
                       ("fetch", "fetch"), ("run", "execute"), ("exec", "execute")):
        if word in low:
            return kind
    return "other"


def inside(workspace: str, path: str) -> str | None:
    """``path`` (relative to ``workspace``, or absolute) as an absolute path, when it lies
    inside ``workspace``; else ``None``."""
    if not isinstance(path, str) or not path or "\0" in path:
        return None
    root = os.path.realpath(workspace)
    full = os.path.normpath(os.path.join(root, path))
    if full != root and not full.startswith(root.rstrip(os.sep) + os.sep):
        return None
    return full


def _title(name: str, arguments: dict[str, Any]) -> str:
    for key in ("command", *_PATH_KEYS, "pattern", "url", "question"):
        value = arguments.get(key)
        if isinstance(value, str) and value:
            shown = value if len(value) <= 120 else value[:117] + "..."
            return f"{name}: {shown}"
    return name


def locations(workspace: str, arguments: dict[str, Any]) -> list[schema.ToolCallLocation]:
    out = []
    for key in _PATH_KEYS:
        full = inside(workspace, arguments.get(key))  # type: ignore[arg-type]
        if full is not None:
            out.append(schema.ToolCallLocation(path=full))
    return out


def tool_start(call_id: str, name: str, arguments: dict[str, Any], workspace: str,
               status: str = "pending") -> schema.ToolCallStart:
    args = dict(arguments) if isinstance(arguments, dict) else {}
    return schema.ToolCallStart(
        session_update="tool_call", tool_call_id=call_id, title=_title(name, args),
        kind=tool_kind(name), status=status, raw_input=args,  # type: ignore[arg-type]
        locations=locations(workspace, args) or None)


def tool_done(call_id: str, name: str, status: str, output: str, changes: Iterable[Any],
              workspace: str) -> schema.ToolCallProgress:
    content: list[Any] = []
    for change in changes:
        diff = diff_content(change, workspace)
        if diff is not None:
            content.append(diff)
    text = output if len(output) <= MAX_OUTPUT else (
        output[:MAX_OUTPUT] + f"\n… [{len(output) - MAX_OUTPUT} more characters in the ledger]")
    if text:
        content.append(schema.ContentToolCallContent(
            type="content", content=schema.TextContentBlock(type="text", text=text)))
    done: Literal["completed", "failed"] = "completed" if status == "ok" else "failed"
    return schema.ToolCallProgress(
        session_update="tool_call_update", tool_call_id=call_id, status=done,
        content=content or None, raw_output={"status": status})


def _field(change: Any, key: str) -> Any:
    return change.get(key) if isinstance(change, dict) else getattr(change, key, None)


def diff_content(change: Any, workspace: str) -> schema.FileEditToolCallContent | None:
    """The ACP ``diff`` of one recorded change (a :class:`dsh.core.messages.Change` or its
    recorded mapping), or ``None`` when its path is not inside the workspace."""
    path = _field(change, "path")
    moved = _field(change, "moved_to")
    full = inside(workspace, moved or path)
    if full is None:
        return None
    diff = _field(change, "diff") or ""
    op = _field(change, "op")
    old, new = _whole(change, full, diff, workspace)
    if new is None:
        old, new = _hunks(diff)
    if op == "add" and not old:
        old = None
    if op == "delete":
        new = ""
    return schema.FileEditToolCallContent(type="diff", path=full, old_text=old, new_text=new)


def _whole(change: Any, full: str, diff: str, workspace: str
           ) -> tuple[str | None, str | None]:
    """The whole old and new texts, when the file still holds what the tool wrote."""
    after = _field(change, "after_sha256")
    if after is None or _field(change, "complete") is False:
        return None, None
    if inside(workspace, os.path.realpath(full)) is None:
        return None, None  # a symlink now leads elsewhere: the hunks, not its content
    try:
        with open(full, "rb") as f:
            data = f.read(MAX_FILE + 1)
    except OSError:
        return None, None
    if len(data) > MAX_FILE or hashlib.sha256(data).hexdigest() != after:
        return None, None
    try:
        new = data.decode("utf-8")
    except UnicodeDecodeError:
        return None, None
    if _field(change, "before_sha256") is None:
        return None, new
    from dsh.tools.changes import DiffMismatch
    from dsh.tools.changes import apply_diff

    try:
        return apply_diff(diff, new, reverse=True), new
    except (DiffMismatch, ValueError):
        return None, None


def ask_diff(ask: Any) -> schema.FileEditToolCallContent | None:
    """A write's approval question as an ACP ``diff`` (the file as it is now, and with the
    change the question shows), when its detail is a diff that applies to the file."""
    detail = getattr(ask, "detail", "") or ""
    if getattr(ask, "action", None) != "write" or not detail.startswith("--- "):
        return None
    last = detail.rstrip("\n").rsplit("\n", 1)[-1]
    if last.startswith("… ("):  # the question shows only the start of a long diff
        return None
    if not detail.endswith("\n"):
        detail += "\n"
    full = inside(ask.root, ask.subject)
    if full is None or inside(ask.root, os.path.realpath(full)) is None:
        return None
    try:
        with open(full, "rb") as f:
            data = f.read(MAX_FILE + 1)
        old: str | None = data.decode("utf-8")
    except FileNotFoundError:
        old = None
    except (OSError, UnicodeDecodeError):
        return None
    if old is not None and len(old) > MAX_FILE:
        return None
    from dsh.tools.changes import DiffMismatch
    from dsh.tools.changes import apply_diff

    try:
        new = apply_diff(detail, old or "")
    except (DiffMismatch, ValueError):
        return None
    return schema.FileEditToolCallContent(type="diff", path=full, old_text=old, new_text=new)


def _hunks(diff: str) -> tuple[str | None, str]:
    """The old and new sides of the diff's hunks (context and changed lines)."""
    old: list[str] = []
    new: list[str] = []
    started = False
    for line in diff.splitlines(keepends=True):
        if line.startswith("@@"):
            if started:
                old.append("…\n")
                new.append("…\n")
            started = True
            continue
        if not started or line.startswith("\\"):
            continue
        sign, rest = line[:1], line[1:]
        if sign in (" ", "-"):
            old.append(rest)
        if sign in (" ", "+"):
            new.append(rest)
    return ("".join(old) or None), "".join(new)


def text_chunk(kind: str, text: str) -> Any:
    block = schema.TextContentBlock(type="text", text=text)
    if kind == "user":
        return schema.UserMessageChunk(session_update="user_message_chunk", content=block)
    if kind == "thought":
        return schema.AgentThoughtChunk(session_update="agent_thought_chunk", content=block)
    return schema.AgentMessageChunk(session_update="agent_message_chunk", content=block)


def plan(tasks: Iterable[Any]) -> schema.AgentPlanUpdate:
    entries = []
    for task in tasks:
        status = task.get("status") if isinstance(task, dict) else None
        content = task.get("content") if isinstance(task, dict) else None
        if isinstance(content, str) and status in ("pending", "in_progress", "completed"):
            entries.append(schema.PlanEntry(content=content, priority="medium", status=status))
    return schema.AgentPlanUpdate(session_update="plan", entries=entries)


def replay(events: Iterable[Any], workspace: str) -> Iterator[Any]:
    """The ``session/update`` payloads that show a session's history: its user messages,
    answers (and reasoning), tool calls with their results, and its task list."""
    from dsh.ledger.events import AssistantMessage
    from dsh.ledger.events import PluginEvent
    from dsh.ledger.events import ToolCalled
    from dsh.ledger.events import ToolReturned
    from dsh.ledger.events import UserMessage

    for event in events:
        if isinstance(event, UserMessage):
            if event.text:
                yield text_chunk("user", event.text)
        elif isinstance(event, AssistantMessage):
            for part in event.reasoning:
                text = getattr(part, "text", "") or ""
                if text:
                    yield text_chunk("thought", text)
            if event.text:
                yield text_chunk("agent", event.text)
        elif isinstance(event, ToolCalled):
            yield tool_start(event.call_id, event.name, dict(event.arguments), workspace,
                             status="in_progress")
        elif isinstance(event, ToolReturned):
            yield tool_done(event.call_id, event.name, event.status, event.output,
                            event.changes, workspace)
        elif isinstance(event, PluginEvent) and (event.plugin, event.name) == (
                "dsh.tasks", "tasks"):
            tasks = event.data.get("tasks")
            if isinstance(tasks, (list, tuple)):
                yield plan(tasks)


def recorded(events: list[Any]) -> tuple[str | None, str | None]:
    """The agent and model the session's last turn recorded."""
    from dsh.ledger.events import TurnStarted

    agent = model = None
    for event in events:
        if isinstance(event, TurnStarted):
            agent = event.agent or agent
            model = event.model or model
    return agent, model


def recorded_cwd(events: list[Any]) -> str | None:
    """The working directory of the session's first turn that recorded one."""
    from dsh.ledger.events import TurnStarted

    return next((e.cwd for e in events if isinstance(e, TurnStarted) and e.cwd), None)


def prompt_text(blocks: list[Any]) -> str:
    """The prompt's text: text blocks as they are, an embedded text resource as a block
    headed by its URI, a resource link by its name and URI; images and audio (not
    advertised) are a ``ValueError``."""
    parts: list[str] = []
    for block in blocks:
        kind = getattr(block, "type", None)
        if kind == "text":
            parts.append(block.text)
        elif kind == "resource":
            res = block.resource
            text = getattr(res, "text", None)
            if text is None:
                raise ValueError(f"embedded resource {res.uri} is not text; dsh acp takes "
                                 "text resources only")
            uri = str(res.uri).replace('"', "%22").replace("\n", "%0A")
            parts.append(f'<resource uri="{uri}">\n{text}\n</resource>')
        elif kind == "resource_link":
            parts.append(f"[{block.name}]({block.uri})")
        else:
            raise ValueError(f"dsh acp does not take {kind} content (promptCapabilities)")
    return "\n\n".join(parts)
