"""``ask_user``: the model asks the person a question and waits for the answer.

The question is asked on the terminal (``/dev/tty``, or the ``tty`` setting), never on stdin:
stdin may carry a prompt or data piped into ``dsh run``, and an answer must come from a
person. It is asked as dsh's approval questions are (:mod:`dsh.tools.approval`): one question
at a time, what was typed before it appeared dropped, the status line paused (``dsh chat``'s
reader of typed lines steps aside meanwhile, so the question is answered inline in a chat).

The question and the choices are the model's text: every control character in them is shown
escaped (:func:`dsh.core.escape.escape_controls`), so they cannot drive the terminal. With
``choices``, they are listed with numbers; the answer is a number (that choice) or the
person's own words. Esc, Ctrl-D or an empty line give no answer; Ctrl-C also interrupts the
run. Without a terminal the tool fails at once, telling the model to decide itself and say
what it assumed: it never waits for an answer that cannot come.

The answer is the tool's result (recorded as every result is); who answered (``person``,
``no-terminal``, ``no-answer``) is also an ``x/dsh.tools/approval`` event with action ``ask``,
as plan mode's question is.
"""

from __future__ import annotations

import os
from typing import Any

from dsh.core.errors import ToolError
from dsh_shell.settings import ShellSettings

#: At most this many choices; each shown cut to :data:`MAX_CHOICE` characters.
MAX_CHOICES = 20
MAX_CHOICE = 300
#: Lines of the question shown (the rest is said to be cut).
MAX_LINES = 60
NAME = "ask_user"


def ask(settings: ShellSettings, question: str, choices: list[str] | None = None) -> str:
    """Ask ``question`` on ``settings.tty``; return the answer as the model reads it."""
    from dsh.host.runcontext import current_or_none
    from dsh.tools import approval

    if not isinstance(question, str) or not question.strip():
        raise ToolError("ask_user: the question is empty; write the question itself")
    options = [str(c) for c in (choices or [])]
    if len(options) > MAX_CHOICES:
        raise ToolError(f"ask_user: at most {MAX_CHOICES} choices, got {len(options)}; "
                        "offer fewer (the person may still type another answer)")
    ctx = current_or_none()
    # What the approval record says was asked (it records no root: none is looked up).
    subject = approval.Ask(tool=NAME, action="ask", subject=question[:2000],
                           root=settings.workspace or "", terminal=settings.tty)
    try:
        answer, ended = _question(_lines(question, options), ctx, settings.tty, len(options))
    except OSError:
        approval.note(subject, approval.Decision(False, "no-terminal",
                                                 "there is no terminal to ask on"))
        raise ToolError("no one can answer: dsh runs without a terminal, so the question "
                        "was not asked; decide yourself and say what you assumed") from None
    if ended:
        approval.note(subject, approval.Decision(False, "no-answer",
                                                 f"no answer before {ended}"))
        raise ToolError(f"no answer: {ended}; decide yourself and say what you assumed")
    if answer is None or not answer.strip():
        approval.note(subject, approval.Decision(False, "person",
                                                 "the person gave no answer"))
        raise ToolError("the person gave no answer; decide yourself and say what you "
                        "assumed")
    text = answer.strip()
    number = _number(text)
    if options and number is not None and 1 <= number <= len(options):
        approval.note(subject, approval.Decision(True, "person",
                                                 f"the person chose {number}"))
        return f"The person chose {number}: {options[number - 1]}"
    approval.note(subject, approval.Decision(True, "person", "the person answered"))
    return f"The person answered: {text}"


def _number(text: str) -> int | None:
    """``text`` as a choice's number (ASCII digits only), else None."""
    return int(text) if text.isascii() and text.isdigit() and len(text) < 6 else None


def _lines(question: str, options: list[str]) -> list[str]:
    """The question as shown: every control character escaped, one line per line."""
    from dsh.core.escape import escape_controls

    def safe(text: str) -> str:
        return escape_controls(text, newlines=False)

    body = question.replace("\r\n", "\n").strip("\n").split("\n")
    lines = [f"dsh: the agent asks: {safe(body[0])}"]
    lines.extend("  " + safe(line) for line in body[1:MAX_LINES])
    if len(body) > MAX_LINES:
        lines.append(f"  (… {len(body) - MAX_LINES} more lines not shown)")
    for number, option in enumerate(options, 1):
        flat = " ".join(option.split())
        cut = flat if len(flat) <= MAX_CHOICE else flat[:MAX_CHOICE - 1] + "…"
        lines.append(f"  {number}. {safe(cut)}")
    lines.append(("answer with a number or your own words" if options else "your answer")
                 + " (Esc: no answer): ")
    return lines


def _question(lines: list[str], ctx: Any, terminal: str, choices: int
              ) -> tuple[str | None, str]:
    """Show ``lines`` on ``terminal`` and read one line: ``(answer, ended)`` as
    :func:`dsh.tools.approval.prompt` asks (one question at a time, type-ahead dropped, the
    status line paused), but keeping the whole line typed. A number outside the choices is
    asked again. Raises :class:`OSError` when there is no terminal."""
    import contextlib
    import sys

    from dsh.tools import approval

    # O_NOCTTY: asking must never make the terminal dsh's controlling terminal.
    fd = os.open(terminal or approval.TTY, os.O_RDWR | os.O_NOCTTY | os.O_CLOEXEC)
    status = sys.modules.get("dsh.cli.status")
    paused = status.status_paused() if status is not None else contextlib.nullcontext()
    with (approval._question_lock, paused, os.fdopen(fd, "r+b", buffering=0) as tty,
          approval._cbreak(fd)):
        approval._drain(fd)  # an answer typed before the question appeared is not an answer
        tty.write(("\n" + "\n".join(lines)).encode("utf-8", "replace"))
        while True:
            answer, ended = approval._read_line(fd, ctx)
            number = _number((answer or "").strip())
            if ended or not choices or number is None or 1 <= number <= choices:
                break
            tty.write(f"choose 1-{choices}, or type your own words: ".encode())
        if ended:
            tty.write(f"(no answer: {ended})\n".encode())
    return answer, ended
