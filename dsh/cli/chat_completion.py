"""Tab completion at ``dsh chat``'s prompt (:class:`ChatCompleter`): ``/`` commands and
``@`` paths.

Imported only by ``dsh chat`` on a terminal (:mod:`dsh.cli.chat_input`).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING
from typing import Any

from prompt_toolkit.completion import Completer
from prompt_toolkit.completion import Completion

if TYPE_CHECKING:
    from prompt_toolkit.document import Document

    from dsh.cli.repl import Chat


class ChatCompleter(Completer):
    """``/`` + Tab: the chat's commands (plugins' included) and the commands plugins expand;
    ``@`` + Tab: a path relative to the current directory (the text stays as typed: ``@path``
    is not expanded, the model reads the file with its tools)."""

    def __init__(self, chat: Chat) -> None:
        self.chat = chat

    def commands(self) -> dict[str, str]:
        table = {name: cmd.help for name, cmd in self.chat.commands.items()}
        try:
            from dsh.run.commands import known_commands

            agent = self.chat.session.agent
            for name, desc in known_commands(agent.pm, agent.handle).items():
                table.setdefault(name, desc)
        except Exception:  # noqa: BLE001 - a plugin's failure must not break completion
            pass
        return table

    def get_completions(self, document: Document, complete_event: Any) -> Iterator[Completion]:
        before = document.text_before_cursor
        if before.startswith("/") and not before.startswith("//") and not any(
                c.isspace() for c in before):
            for name, desc in sorted(self.commands().items()):
                if name.startswith(before[1:]):
                    yield Completion("/" + name, start_position=-len(before),
                                     display_meta=" ".join(desc.split())[:60])
            return
        word = before.split()[-1] if before.split() and not before[-1:].isspace() else ""
        if word.startswith("@"):
            yield from self.paths(word[1:])

    def paths(self, typed: str) -> Iterator[Completion]:
        head, _, stem = typed.rpartition("/")
        base = Path.cwd() / head if head else Path.cwd()
        try:
            names = sorted(os.listdir(base))
        except OSError:
            return
        for name in names:
            if not name.startswith(stem) or (name.startswith(".") and not stem):
                continue
            shown = name + ("/" if (base / name).is_dir() else "")
            yield Completion((head + "/" if head else "") + shown, start_position=-len(typed),
                             display=shown)
