"""``dsh.memory``: facts the model remembers, and an opt-in project memory file (issue 25).

Opt-in per agent (``[plugins."dsh.memory"] enabled = true``, or the agent's own
``[agents.NAME.plugin_settings."dsh.memory"]``). The agent gets ``remember(fact)`` and
``forget(id)``; each is an ``x/dsh.memory/memory`` event folded into :data:`MEMORY` (a
:class:`dsh.ledger.state.StateKey`), so the facts survive resume, a crash and a compaction.

``file = "PATH"`` (relative to the working directory) adds a project memory file shared
across sessions: at the start of each turn its content is read (at most :data:`MAX_FILE`
bytes, UTF-8) and, when its SHA-256 differs from the one recorded last, recorded with the
digest (``{"op": "file", "path", "sha256", "text"}``). The prompt is built from that record,
never from the file, so a resumed session sends exactly what it recorded even if the file
has changed since — and a change is recorded at the next turn. ``remember(fact,
project=true)`` appends the fact to that file as a ``- fact`` line.

At the start of each turn the memory is part of the system prompt (``order`` :data:`ORDER`,
before dsh.tasks' list), recorded on ``turn/start``. Bounds: :data:`MAX_FACTS` facts of at
most :data:`MAX_FACT` characters; a file over :data:`MAX_FILE` bytes is not used (recorded
with the problem, said in the prompt and on stderr) and is never sent.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from dsh.core.errors import DshWarning
from dsh.core.errors import ToolError
from dsh.hookspecs import hookimpl
from dsh.ledger.state import StateKey

PLUGIN = "dsh.memory"
MAX_FACTS = 200
MAX_FACT = 2000
#: The largest project memory file used, in bytes (its text must fit one plugin event).
MAX_FILE = 32 * 1024
#: Where the memory goes in the turn's system prompt (before dsh.tasks' 300).
ORDER = 200
#: The problem recorded for a project memory file that does not exist (yet): not warned.
MISSING = "does not exist (yet)"
#: The start of the problem recorded for a file whose content is not trusted (the trust gate
#: has said so on stderr: not warned again).
UNTRUSTED = "is not trusted with its current content"
INITIAL: dict[str, Any] = {"facts": [], "next": 1, "file": None}


def _sha256(data: bytes) -> str:
    import hashlib  # only with a project memory file: not on every run's import path

    return hashlib.sha256(data).hexdigest()


def reduce(state: Mapping[str, Any], data: Mapping[str, Any]) -> dict[str, Any]:
    op = data.get("op")
    facts = list(state["facts"])
    nxt = state["next"]
    file = state["file"]
    if op == "remember":
        text = data.get("text")
        if not isinstance(text, str) or not text.strip() or len(text) > MAX_FACT:
            raise ValueError(f"a fact is non-empty text of at most {MAX_FACT} characters")
        if len(facts) >= MAX_FACTS:
            raise ValueError(f"memory is full ({MAX_FACTS} facts): forget some first")
        facts.append({"id": nxt, "text": text})
        nxt += 1
    elif op == "forget":
        ident = data.get("id")
        kept = [f for f in facts if f["id"] != ident]
        if len(kept) == len(facts):
            raise ValueError(f"no remembered fact has id {ident!r}")
        facts = kept
    elif op == "file":
        file = {k: data.get(k) for k in ("path", "sha256", "text", "size", "problem")}
    else:
        raise ValueError(f"unknown memory operation {op!r} (remember, forget, file)")
    return {"facts": facts, "next": nxt, "file": file}


MEMORY: StateKey[dict[str, Any]] = StateKey(PLUGIN, "memory", INITIAL, reduce,
                                               show=lambda v: render(v) or "(empty)")


def settings(agent: Any) -> Mapping[str, Any]:
    return agent.plugin_settings(PLUGIN)


def render(state: Mapping[str, Any]) -> str:
    """The memory as the model and ``dsh sessions show`` see it ('' when empty). The file's
    text and the facts cannot open a section of the prompt (:mod:`dsh.core.prompttext`)."""
    from dsh.core.prompttext import block
    from dsh.core.prompttext import item

    parts = []
    file = state["file"]
    if file:
        if file.get("problem"):
            parts.append(f"(project memory file {file['path']}: {file['problem']})")
        elif file.get("text", "").strip():
            parts.append(f"From the project memory file {file['path']}:\n"
                         f"{block(file['text'].strip())}")
    if state["facts"]:
        parts.append("Remembered in this session (forget with forget(id)):\n"
                     + "\n".join(f"- [{f['id']}] {item(f['text'])}" for f in state["facts"]))
    return "\n\n".join(parts)


def _where(path: Path) -> tuple[str, str]:
    """The folder the memory file is opened beneath, and its name there: the working
    directory for a relative path (so no link in it is followed), else its own folder."""
    if path.is_absolute():
        return str(path.parent), path.name
    return os.getcwd(), str(path)


def read_file(path: Path) -> dict[str, Any]:
    """The ``file`` update for the project memory file now: its text and digest, or the
    problem (missing, too large, not UTF-8, not a regular file, a symbolic link, not
    trusted). Read once, by descriptor (:mod:`dsh.core.beneath`); its bytes are used only
    when the person trusted them (:func:`dsh.config.trust.gate`)."""
    from dsh.config import trust
    from dsh.core import beneath
    from dsh.core.files import TooLarge
    from dsh.core.files import reason

    shown = str(path)
    root, rel = _where(path)
    try:
        data = beneath.read(root, rel, MAX_FILE)
    except FileNotFoundError:
        return {"op": "file", "path": shown, "problem": MISSING}
    except TooLarge as exc:
        return {"op": "file", "path": shown, "size": exc.size,
                "problem": f"is {exc.size} bytes; the limit is {MAX_FILE}: not used"}
    except beneath.Refused as exc:
        return {"op": "file", "path": shown, "problem": f"is not read: {exc.why}"}
    except OSError as exc:
        kind = getattr(exc, "kind", None)
        return {"op": "file", "path": shown,
                "problem": f"is {kind}, not a file" if kind else f"cannot be read: {reason(exc)}"}
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        return {"op": "file", "path": shown, "problem": f"is not UTF-8 (byte {exc.start})"}
    if not trust.gate(root, rel, data, "memory", text[:2000]):
        return {"op": "file", "path": shown, "sha256": _sha256(data),
                "problem": f"{UNTRUSTED}: not used "
                           f"(dsh trust approve {shown})"}
    return {"op": "file", "path": shown, "size": len(data),
            "sha256": _sha256(data), "text": text}


def remember(fact: str, project: bool = False) -> str:
    """Remember a fact for the rest of this session (it is shown to you at each turn).

    :param fact: the fact, in one or a few sentences.
    :param project: also append it to the project memory file, shared with later sessions.
    """
    from dsh.ledger.state import StateError

    if not fact.strip() or len(fact) > MAX_FACT:
        raise ToolError(f"remember: a fact is non-empty text of at most {MAX_FACT} characters")
    try:
        state = MEMORY.update({"op": "remember", "text": fact})
    except StateError as exc:
        raise ToolError(f"remember: {str(exc).rpartition(': ')[2]}") from None
    ident = state["facts"][-1]["id"]
    if not project:
        return f"Remembered as [{ident}]."
    from dsh.host.runcontext import context

    path = _file_setting(context().handle)
    if path is None:
        return f"Remembered as [{ident}] (no project memory file is configured)."
    line = ("- " + " ".join(fact.split()) + "\n").encode("utf-8")
    try:
        _append(path, line)
    except ToolError as exc:
        raise ToolError(f"remember: {exc}; remembered as [{ident}] for this session "
                        "only") from None
    return f"Remembered as [{ident}] and in {path} (from the next turn)."


def _append(path: Path, line: bytes) -> None:
    """Append ``line`` to the project memory file through a descriptor (a symbolic link in
    its place is refused, never appended through). A write to a project file: the approval
    service decides it first (the permission mode, a grant, or the person, shown the line;
    no terminal in mode ``ask`` means no). Then the file stays trusted when the content it
    extends was (or it was empty): the line was approved, and the ledger records the fact."""
    from dsh.config import trust
    from dsh.core import beneath
    from dsh.core.files import reason
    from dsh.tools import approval

    root, rel = _where(path)
    approval.request(approval.Ask(tool="remember", action="write", subject=rel, root=root,
                                  detail="+ " + line.decode("utf-8", "replace").rstrip()))
    fd = None
    try:
        fd = beneath.open_beneath(root, rel, os.O_RDWR | os.O_APPEND | os.O_CREAT
                                  | os.O_NONBLOCK, 0o644)
        import fcntl
        import stat

        fcntl.flock(fd, fcntl.LOCK_EX)
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ToolError(f"{path} is not a regular file")
        if st.st_size + len(line) > MAX_FILE:
            raise ToolError(f"{path} would exceed {MAX_FILE} bytes")
        before = os.pread(fd, st.st_size, 0)
        was = trust.state(root, rel, before)
        view = memoryview(line)
        while view:
            view = view[os.write(fd, view):]
        if was == "trusted" or not before:
            trust.approve(root, rel, trust.digest(before + line), "memory")
    except beneath.Refused as exc:
        raise ToolError(f"cannot write {path}: {exc.why}") from None
    except OSError as exc:
        raise ToolError(f"cannot write {path}: {reason(exc)}") from None
    finally:
        if fd is not None:
            os.close(fd)


def forget(id: int) -> str:  # noqa: A002 - the model's word for it
    """Forget a fact remembered in this session.

    :param id: the fact's number, as shown in brackets.
    """
    from dsh.ledger.state import StateError

    try:
        MEMORY.update({"op": "forget", "id": id})
    except StateError as exc:
        raise ToolError(f"forget: {str(exc).rpartition(': ')[2]}") from None
    return f"Forgot [{id}]."


def _file_setting(agent: Any) -> Path | None:
    value = settings(agent).get("file")
    if not value:
        return None
    return Path(os.path.expanduser(str(value)))


@hookimpl
def register_tools(register: Any, agent: Any) -> None:
    if settings(agent).get("enabled", False):
        register(remember, name="remember")
        register(forget, name="forget")


@hookimpl
def turn_prompt(register: Any, agent: Any, session: Any) -> None:
    if not settings(agent).get("enabled", False):
        return
    path = _file_setting(agent)
    if path is not None:
        now = read_file(path)
        recorded = session.state(MEMORY)["file"] or {}
        if any(now.get(k) != recorded.get(k) for k in ("path", "sha256", "problem")):
            session.update_state(MEMORY, now)
            problem = now.get("problem")
            if problem not in (None, MISSING) and not problem.startswith(UNTRUSTED):
                warnings.warn(f"dsh.memory: {now['path']} {problem}",
                              DshWarning, stacklevel=2)
    text = render(session.state(MEMORY))
    if text:
        register("## Memory\n\n" + text, order=ORDER, name="memory")
