"""Recorded text placed inside a section of the system prompt, unable to start one of its own.

dsh's system prompt is made of sections, each opening with a Markdown heading (``## Memory``,
``## Tasks``). What goes inside them is recorded state that a model wrote (a task, a
remembered fact) or a workspace file held (the project memory file): text that may hold a
line break followed by ``## Memory`` and a fake fact. Two helpers keep such text inside the
section it belongs to, with no line a Markdown reader (or a model) takes for the start of
another part of the prompt:

* :func:`block` — text that fills whole lines (a file's text): a line that would open a
  heading (``#``…), underline the line before into one (``===``, ``---``) or open a fenced
  block (three backticks or tildes) loses its leading blanks and gets a backslash before its
  first character (``\\## Memory``), which Markdown shows as that character, literally. Every
  line break (``\\r``, ``\\u2028`` and the other separators :meth:`str.splitlines` knows,
  which a model may read as one) becomes ``\\n``, so the check sees every line.
* :func:`item` — text after a prefix on its line (``[ ] 1. ``, ``- [3] ``): the same escapes,
  and every line after the first indented by :data:`INDENT`, so it stays a continuation of
  its item (four spaces: in Markdown, never a heading, an underline or a fence).

Text without a line break or a special first character is returned unchanged (the common
case costs one regular-expression search).
"""

from __future__ import annotations

import re

__all__ = ["INDENT", "block", "item"]

#: How continuation lines of an :func:`item` are indented.
INDENT = "    "

#: Every line boundary :meth:`str.splitlines` knows.
_BREAK = re.compile("[\n\r\v\f\x1c\x1d\x1e\x85\u2028\u2029]")
#: A line (its leading blanks dropped) that would open a heading or a fence, or underline
#: the line before into a heading (setext: ``===`` or ``---`` alone on the line).
_OPENS = re.compile(r"#|```|~~~|=+[ \t]*\Z|-+[ \t]*\Z|(?:-[ \t]*){3,}\Z")


def _line(line: str) -> str:
    bare = line.lstrip(" \t")
    return "\\" + bare if _OPENS.match(bare) else line


def block(text: str) -> str:
    """``text`` with no line that opens a heading, an underline or a fence (see the module's
    docstring); its line breaks made ``\\n``."""
    if _BREAK.search(text) is None:
        return _line(text)
    return "\n".join(_line(line) for line in text.splitlines())


def item(text: str, indent: str = INDENT) -> str:
    """``text`` placed after a prefix on its line: its first line as it is (the prefix comes
    before it), every later line escaped as :func:`block` does and indented by ``indent``."""
    if _BREAK.search(text) is None:
        return text
    first, *rest = text.splitlines()
    return "\n".join([first, *(indent + _line(line) if line.strip() else "" for line in rest)])
