"""The history of ``dsh chat``'s prompt (:class:`LineHistory`, a prompt_toolkit history):
the file the chat has always used, ``$DSH_HOME/chat_history``, owner-only.

Imported only by ``dsh chat`` on a terminal (:mod:`dsh.cli.chat_input`).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from collections.abc import Iterator
from pathlib import Path

from prompt_toolkit.history import History

HISTORY_LENGTH = 1000


class LineHistory(History):
    """The prompt history in the file ``dsh chat`` has always used (one entry a line, the
    last :data:`HISTORY_LENGTH` kept), owner-only (``0600``): what people type may be
    private. Each entry is appended as it is accepted."""

    def __init__(self, path: Path, on_error: Callable[[str], None]) -> None:
        super().__init__()
        self.path = path
        self.on_error = on_error

    def load_history_strings(self) -> Iterator[str]:
        try:
            lines = self.path.read_text(encoding="utf-8", errors="replace").splitlines()
        except OSError:
            return iter(())
        lines = [x for x in lines if x.strip()][-HISTORY_LENGTH:]
        return reversed(lines)

    def store_string(self, string: str) -> None:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
            with os.fdopen(fd, "a", encoding="utf-8") as f:
                os.chmod(self.path, 0o600)
                for line in string.splitlines():
                    if line.strip():
                        f.write(line + "\n")
        except OSError as exc:
            self.on_error(f"dsh: warning: cannot save the chat history to {self.path}: {exc}")
