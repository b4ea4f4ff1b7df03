"""How a recorded change (:class:`~dsh.core.messages.Change`) is shown: ``dsh sessions show``,
``dsh chat`` and the Markdown export render the diff the ledger holds, never the disk.

The diff is the model's and the workspace's text: on a terminal its control characters are
escaped before dsh adds its own colours (added lines green, removed red, hunks cyan).
"""

from __future__ import annotations

from collections.abc import Callable
from collections.abc import Iterable
from typing import Any

from dsh.core.messages import Change

#: Lines of one diff shown without ``--full``.
DIFF_LINES = 40


def headline(c: Change) -> str:
    """``update src/app.py (+3 -1)``, ``move a.py -> b.py``: one line per change."""
    where = f"{c.path} -> {c.moved_to}" if c.moved_to else c.path
    cut = "" if c.complete else ", diff incomplete"
    return f"{c.op} {where} (+{c.added} -{c.removed}{cut})"


def _style_of(line: str) -> dict[str, Any]:
    if line.startswith(("+++ ", "--- ")):
        return {"bold": True}
    if line.startswith("+"):
        return {"fg": "green"}
    if line.startswith("-"):
        return {"fg": "red"}
    if line.startswith("@@"):
        return {"fg": "cyan"}
    return {"dim": True}


def diff_lines(changes: Iterable[Change], style: Callable[..., str], *, full: bool = False,
               limit: int = DIFF_LINES, indent: str = "  ") -> list[str]:
    """The styled lines showing ``changes``: a headline each, then its diff (at most
    ``limit`` lines unless ``full``, with a note saying how many are left out).

    ``style(text, **click_style)`` escapes and colours a fragment (``dsh.cli.render``'s
    styler, or ``click.style`` after escaping).
    """
    out: list[str] = []
    for c in changes:
        out.append(indent + style("± " + headline(c), fg="magenta", bold=True))
        lines = c.diff.splitlines()
        shown = lines if full else lines[:limit]
        out.extend(indent + "  " + style(line, **_style_of(line)) for line in shown)
        if len(shown) < len(lines):
            out.append(indent + "  " + style(f"… ({len(lines) - len(shown)} more lines of "
                                             "diff; --full)", dim=True))
    return out


def markdown(changes: Iterable[Change]) -> str:
    """The changes as Markdown: a headline and a ```diff fence each."""
    parts = []
    for c in changes:
        body = c.diff.rstrip("\n")
        fence = "```"
        while fence in body:
            fence += "`"
        parts.append(f"- {headline(c)}\n\n{fence}diff\n{body}\n{fence}")
    return "\n\n".join(parts)
