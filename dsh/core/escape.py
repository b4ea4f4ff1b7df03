"""Text from a model, a tool or a ledger made fit for a terminal (docs/security.md).

Such text is untrusted: written to a terminal it goes through :func:`escape_controls` (every
writer of ``dsh`` that targets a terminal uses it), so an escape sequence in it cannot set the
clipboard (OSC 52), retitle or clear the window, or redraw what is on screen. Written to a pipe
or a file, it is passed on byte for byte. A JSON line bound for a terminal gets
:func:`escape_json_controls` (the same JSON value). Also here: :func:`use_color` (colour only
on a terminal, and ``NO_COLOR`` unset) and :func:`one_line` (text cut to one line).

Imports only the standard library: ``dsh run``'s status line and every ``dsh:`` line on
stderr use it.
"""

from __future__ import annotations

import os
import re
from typing import IO


def use_color(stream: IO[str]) -> bool:
    """Colour only on a terminal, and never when ``NO_COLOR`` is set (https://no-color.org)."""
    if os.environ.get("NO_COLOR"):
        return False
    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty())


#: What a terminal would act on instead of showing: C0 controls but newline and tab, DEL, C1
#: controls (U+0080-U+009F: CSI, OSC, DCS as one character), the bidirectional overrides and
#: isolates (Trojan Source: text shown in another order than it is), and lone surrogates.
_CONTROLS = re.compile("\r\n|[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e"
                       "\u2066-\u2069\ud800-\udfff]")
_LINE_CONTROLS = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e"
                            "\u2066-\u2069\ud800-\udfff]")
_NAMED = {"\r": "\\r", "\x1b": "\\x1b", "\n": "\\n", "\t": "\\t"}


def _visible(match: re.Match[str]) -> str:
    c = match.group()
    if c == "\r\n":
        return "\n"  # a Windows line end is a line end, not a carriage-return trick
    named = _NAMED.get(c)
    if named is not None:
        return named
    code = ord(c)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def escape_controls(text: str, *, newlines: bool = True) -> str:
    """``text`` safe to show on a terminal: every control character is made visible as a
    Python-style escape (``\\x1b``, ``\\r``, ``\\x9b``, ``\\u202e``), so no escape
    sequence, BEL, backspace or carriage return in it reaches the terminal. Newlines and tabs
    are kept (a ``\\r\\n`` line end becomes ``\\n``) unless ``newlines`` is false (one-line
    contexts). Per character, so a sequence split across streamed pieces is caught too.
    Only for terminals: pipes and files get the text unchanged."""
    pattern = _CONTROLS if newlines else _LINE_CONTROLS
    if pattern.search(text) is None:
        return text
    return pattern.sub(_visible, text)


#: Characters that JSON leaves raw (``json.dumps`` escapes only U+0000-U+001F) but a terminal
#: acts on: DEL, C1 controls, bidirectional controls, lone surrogates.
_JSON_RAW = re.compile("[\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069"
                       "\ud800-\udfff]")


def escape_json_controls(line: str) -> str:
    """A JSON text (from ``json.dumps``) with the controls a terminal would act on written as
    ``\\uXXXX`` escapes: the same JSON value, safe on a terminal."""
    if _JSON_RAW.search(line) is None:
        return line
    return _JSON_RAW.sub(lambda m: f"\\u{ord(m.group()):04x}", line)


def one_line(text: str, width: int) -> str:
    """``text`` on one line, cut to ``width`` characters with an ellipsis."""
    flat = " ".join(text.split())
    return flat if len(flat) <= width else flat[: max(0, width - 1)] + "…"
