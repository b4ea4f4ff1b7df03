"""dsh-notes: notes an agent keeps for the rest of a session, written with ``from dsh import``.

* ``add_note(text)`` records a note as recorded state (:class:`dsh.StateKey`): it survives a
  resume, and the turn's system prompt shows the notes (a ``turn_prompt`` fragment);
* ``count_words(path)`` runs ``wc`` on a workspace file, confined by the agent's sandbox
  policy (:func:`dsh.sandbox.run`);
* a ``pre_execute`` guard refuses any tool call whose ``path`` argument names a protected
  file (``.env`` by default);
* ``dsh notes [--session ID]`` prints a session's notes (read-only, :func:`dsh.pass_app`);
* its settings are an attrs class (``declare_settings``), validated by dsh and read per agent
  with :func:`dsh.settings`.
"""

from __future__ import annotations

import fnmatch
import os
from collections.abc import Callable
from collections.abc import Mapping
from pathlib import PurePath
from typing import Any

import attrs

import dsh

PLUGIN = "dsh_notes"


@attrs.frozen
class NotesSettings:
    """``[plugins.dsh_notes]``, overlaid per agent by ``[agents.A.plugin_settings.dsh_notes]``."""

    #: The most notes a session keeps; ``add_note`` refuses more.
    max_notes: int = 20
    #: The heading of the notes in the system prompt.
    heading: str = "Notes"
    #: File name patterns no tool call may name as its ``path`` argument.
    protected: list[str] = attrs.field(factory=lambda: [".env", "*.pem"])
    #: Seconds ``count_words`` lets ``wc`` run.
    timeout: float = 30.0


class TooManyNotes(Exception):
    """The reducer's own error: the session already holds ``max`` notes."""


def add(notes: list[str], data: Mapping[str, Any]) -> list[str]:
    """The reducer: pure, so that a resumed session folds the same list from the ledger."""
    if len(notes) >= data["max"]:
        raise TooManyNotes(f"the session already holds {data['max']} notes")
    return [*notes, data["text"]]


NOTES: dsh.StateKey[list[str]] = dsh.StateKey(PLUGIN, "notes", [], add)


@dsh.hookimpl
def declare_settings() -> type:
    return NotesSettings


@dsh.hookimpl
def register_tools(register: Callable[..., None], agent: dsh.AgentHandle) -> None:
    settings = dsh.settings(NotesSettings, agent)  # this agent's: validated, cached

    def add_note(text: str) -> str:
        """Remember a note for the rest of this session (it is shown in every later turn).

        :param text: the note, one line.
        """
        if not text.strip():
            raise dsh.ToolError("a note needs some text")
        try:
            # update() returns the value its own update produced, under the ledger's lock:
            # two calls in one step never both see 19 notes and both add a 20th.
            notes = NOTES.update({"text": text.strip(), "max": settings.max_notes})
        except dsh.StateError as err:
            if isinstance(err.reducer_error, TooManyNotes):
                raise dsh.ToolError(str(err.reducer_error)) from None
            raise
        return f"noted ({len(notes)} of {settings.max_notes})"

    def count_words(path: str) -> str:
        """Count the lines, words and bytes of a file of the workspace.

        :param path: the file, relative to the working directory.
        """
        result = dsh.sandbox.run(["wc", "--", path], cwd=os.getcwd(), timeout=settings.timeout)
        if result.returncode != 0:
            raise dsh.ToolError(f"wc failed ({result.returncode}): {str(result.stderr).strip()}")
        lines, words, size, *_ = str(result.stdout).split()
        return f"{path}: {lines} lines, {words} words, {size} bytes"

    register(add_note)
    register(count_words)


@dsh.hookimpl
def turn_prompt(register: Callable[..., None], agent: dsh.AgentHandle, session: Any) -> None:
    notes = session.state(NOTES)
    if notes:
        heading = dsh.settings(NotesSettings, agent).heading
        register(f"## {heading}\n" + "\n".join(f"- {note}" for note in notes), name="notes")


@dsh.hookimpl
def pre_execute(call: dsh.ToolInvocation) -> None:
    path = call.arguments.get("path")
    if not isinstance(path, str):
        return
    name = PurePath(path).name
    for pattern in dsh.settings(NotesSettings, call.handle).protected:
        if fnmatch.fnmatch(name, pattern):
            call.block(f"{path} is protected for agent {call.agent_name} ({pattern})")
            return


@dsh.hookimpl
def register_commands(cli: Any) -> None:
    import click  # dsh's command line is click: imported only when commands are listed

    @cli.command("notes")
    @click.option("--session", default="latest", show_default=True,
                  help="The session: an id, a unique prefix or 'latest'.")
    @dsh.pass_app
    def notes(app: dsh.App, session: str) -> None:
        """Print the notes of a session (read-only: no model, no lock)."""
        for note in app.reader(session).state(NOTES):
            click.echo(f"- {dsh.escape_controls(note)}")  # the model wrote it: untrusted
