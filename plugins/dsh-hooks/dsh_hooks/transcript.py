"""``transcript_path``: the session rendered in Claude Code's transcript shape (JSON Lines).

Hook scripts written for Claude Code read the file ``transcript_path`` names: one JSON object
a line, ``type`` ``user`` or ``assistant``, ``message: {role, content: [...]}`` with ``text``,
``tool_use`` and ``tool_result`` blocks, and ``uuid``, ``parentUuid``, ``sessionId``,
``timestamp``, ``cwd``. dsh's ledger is not in that shape, so the engine renders one from it:

- **derived, never read back**: written from the ledger's own lines (the truth, MISSION C3);
  nothing of dsh reads the rendering;
- **kept in step**: before every hook process that gets the path, the ledger lines appended
  since the last rendering are rendered and appended (work per hook grows with what is new,
  not with the session's length);
- **private and temporary**: a file in a fresh ``0700`` directory of the system's temp
  directory, ``0600``, removed when the run ends; a session without a file (``--no-save``)
  has no transcript (``transcript_path`` is ``""``).

Every value is written with :func:`json.dumps` (compact, as Claude Code writes it), so text
the model or a tool produced stays JSON-escaped: a ``"role":"assistant"`` inside a message
cannot forge a line.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import threading
import uuid
from typing import Any

#: Ledger bytes rendered per sync at most (the rest the next time): bounds one hook's cost.
CHUNK = 64 * 1024 * 1024
_NS = uuid.UUID("5d1e9b0c-7a49-4c39-9d51-3f2a2f0e8a11")


#: Characters some line readers (Python's ``splitlines``) split on, escaped in the output:
#: JSON only has them inside strings, where ``\uXXXX`` means the same.
_SEPARATORS = str.maketrans({c: f"\\u{ord(c):04x}" for c in "\x85\u2028\u2029\x1c\x1d\x1e"})


def _dump(line: dict[str, Any]) -> str:
    text = json.dumps(line, ensure_ascii=False, separators=(",", ":"), default=str)
    return text.translate(_SEPARATORS)


class Transcript:
    """The rendering of one session's ledger (``ledger.path``) into ``self.path``."""

    def __init__(self, ledger_path: str, session_id: str, cwd: str) -> None:
        self.ledger_path = ledger_path
        self.session_id = session_id
        self.cwd = cwd
        self._dir = tempfile.mkdtemp(prefix="dsh-transcript-")  # 0700
        self.path = os.path.join(self._dir, f"{session_id}.jsonl")
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        os.close(fd)
        self._offset = 0
        self._parent: str | None = None
        self._lock = threading.Lock()

    def sync(self) -> str:
        """Render what the ledger gained since the last call; the transcript's path."""
        with self._lock:
            try:
                with open(self.ledger_path, "rb") as f:
                    f.seek(self._offset)
                    data = f.read(CHUNK)
            except OSError:
                return self.path
            end = data.rfind(b"\n")
            if end < 0:
                return self.path
            self._offset += end + 1
            out = []
            for raw in data[:end].split(b"\n"):
                try:
                    event = json.loads(raw)
                except ValueError:
                    continue
                if isinstance(event, dict):
                    for line in self._render(event):
                        out.append(_dump(line))
            if out:
                with open(self.path, "a", encoding="utf-8", errors="surrogatepass") as t:
                    t.write("\n".join(out) + "\n")
            return self.path

    def close(self) -> None:
        shutil.rmtree(self._dir, ignore_errors=True)

    def _line(self, event: dict[str, Any], kind: str, message: dict[str, Any]) -> dict[str, Any]:
        me = str(uuid.uuid5(_NS, f"{self.session_id}:{event.get('seq')}:{kind}"))
        line = {"parentUuid": self._parent, "isSidechain": False, "userType": "external",
                "cwd": self.cwd, "sessionId": self.session_id, "version": "dsh",
                "type": kind, "message": message, "uuid": me,
                "timestamp": event.get("ts", "")}
        self._parent = me
        return line

    def _render(self, event: dict[str, Any]) -> list[dict[str, Any]]:
        kind = event.get("type")
        if kind == "user/message":
            text = event.get("text")
            if not isinstance(text, str):
                return []
            return [self._line(event, "user", {"role": "user",
                                               "content": [{"type": "text", "text": text}]})]
        if kind == "assistant/message":
            content: list[dict[str, Any]] = []
            if isinstance(event.get("text"), str) and event["text"]:
                content.append({"type": "text", "text": event["text"]})
            for call in event.get("tool_calls") or []:
                if isinstance(call, dict):
                    content.append({"type": "tool_use", "id": call.get("id"),
                                    "name": call.get("name"),
                                    "input": call.get("arguments") or {}})
            if not content:
                return []
            message = {"role": "assistant", "type": "message", "model": event.get("model", ""),
                       "content": content, "stop_reason": event.get("stop_reason"),
                       "usage": event.get("usage") or {}}
            return [self._line(event, "assistant", message)]
        if kind == "tool/result":
            block = {"type": "tool_result", "tool_use_id": event.get("call_id"),
                     "content": event.get("output") if isinstance(event.get("output"), str)
                     else json.dumps(event.get("output"), default=str),
                     "is_error": event.get("status") != "ok"}
            return [self._line(event, "user", {"role": "user", "content": [block]})]
        return []
