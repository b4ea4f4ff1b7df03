"""The recap a resumed ``dsh chat`` (``-c``, ``--session ID``) prints on stderr: the last
exchanges of the session, each message cut to a line, read from the session's ledger (the
events as recorded, not the compacted projection), with controls made visible.
"""

from __future__ import annotations

from typing import Any

from dsh.cli.escape import escape_controls
from dsh.cli.escape import one_line

#: Exchanges shown, and the width of each line of the recap.
EXCHANGES = 3
WIDTH = 160


def exchanges(events: list[Any]) -> list[tuple[str, str]]:
    """Each turn's first message from the person and its last answer with text."""
    turns: list[list[str]] = []
    for e in events:
        kind = getattr(e, "type", "")
        if kind == "turn/start":
            turns.append(["", ""])
        elif not turns:
            continue
        elif kind == "user/message" and not turns[-1][0] and e.text.strip():
            turns[-1][0] = e.text
        elif kind == "assistant/message" and e.text.strip():
            turns[-1][1] = e.text
    return [(asked, answer) for asked, answer in turns if asked or answer]


def recap(store: Any, session_id: str, count: int = EXCHANGES) -> list[str]:
    """The recap's lines (empty when the session has no exchange yet or cannot be read)."""
    from dsh.core import errors

    try:
        found = exchanges(list(store.read(session_id)))
    except (errors.DshError, OSError):
        return []
    if not found:
        return []
    shown = found[-count:]
    head = (f"resumed: the last {len(shown)} of {len(found)} exchanges"
            if len(found) > len(shown) else
            f"resumed: {len(found)} exchange{'s' if len(found) != 1 else ''} so far")
    lines = [head]

    def cut(text: str) -> str:
        return escape_controls(one_line(text, WIDTH), newlines=False)

    for asked, answer in shown:
        lines.append(f"  you: {cut(asked) if asked else '(no message)'}")
        lines.append(f"  agent: {cut(answer) if answer else '(no answer)'}")
    return lines
