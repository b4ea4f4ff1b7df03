"""The workbench's tool definitions: each tool's signature and docstring (what the model
reads), and a body that imports the module doing the work at the first call.

Registering a tool needs only its signature: an agent assembled with dsh-shell, on every
``dsh run``, builds these functions and imports none of :mod:`dsh_shell.edit`,
:mod:`dsh_shell.patch`, :mod:`dsh_shell.search`, :mod:`dsh_shell.grep`,
:mod:`dsh_shell.ask` (tests/test_hot_path.py keeps it so).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING
from typing import Any

if TYPE_CHECKING:
    from dsh.sandbox.policy import Policy
    from dsh_shell.settings import ShellSettings


#: The schema of one item of ``multi_edit``'s ``edits`` (a signature says only "objects").
EDIT_ITEM: dict[str, Any] = {
    "type": "object",
    "properties": {
        "old": {"type": "string", "description": "the exact text to replace"},
        "new": {"type": "string", "description": "the text to put in its place"},
        "replace_all": {"type": "boolean", "default": False,
                        "description": "replace every match instead of exactly one"},
    },
    "required": ["old", "new"],
    "additionalProperties": False,
}



def register_edits(register: Callable[..., None], settings: ShellSettings,
             unprotected: tuple[str, ...], protect: tuple[str, ...]) -> None:
    """Register ``edit_file``, ``multi_edit`` and ``apply_patch`` in ``settings``' workspace;
    ``unprotected`` and ``protect`` (the memory file) as for ``write_file``."""
    from dsh.tools.registry import build_tool
    from dsh.tools.registry import parse_docstring

    def root() -> str:
        from dsh_shell import workspace

        return workspace.workspace_root(settings.workspace_path())

    def edit_file(path: str, old: str, new: str, replace_all: bool = False) -> str:
        """Replace exact text in a file of the workspace; return the diff of the change.

        old must match the file exactly (whitespace and indentation included) and, unless
        replace_all is true, only once: include enough surrounding lines to make it unique.
        Read the file first. Line endings, a BOM and the encoding are kept as the file has
        them. Use write_file to create a file, multi_edit for several changes to one file,
        apply_patch for changes across files.

        :param path: file path relative to the workspace, e.g. "src/app.py".
        :param old: the exact text to replace (not empty).
        :param new: the text to put in its place (different from old).
        :param replace_all: replace every match of old instead of exactly one.
        """
        from dsh_shell import edit

        return edit.edit_text(root(), path, old, new, replace_all, unprotected, protect)

    def multi_edit(path: str, edits: list[dict[str, Any]]) -> str:
        """Make several exact replacements in one file, all or nothing; return the diff.

        The edits are applied in order, each to the result of the ones before, as edit_file
        would (exact match, unique unless replace_all). If any edit fails nothing is written
        and the error names the edit.

        :param path: file path relative to the workspace, e.g. "src/app.py".
        :param edits: the replacements, in order: [{"old": ..., "new": ..., "replace_all":
            false}, ...].
        """
        from dsh_shell import edit

        return edit.edit_many(root(), path, edits, unprotected, protect)

    def apply_patch(patch: str) -> str:
        """Add, delete, update and rename files with one patch, all or nothing.

        The patch format (each line of a hunk starts with ' ' for context, '-' to remove,
        '+' to add; give about 3 lines of context around each change):

        *** Begin Patch
        *** Add File: docs/new.md
        +every line of the new file, each after a +
        *** Delete File: old/unused.py
        *** Update File: src/app.py
        *** Move to: src/main.py
        @@ def greet():
         context line, as it is in the file
        -a line to remove
        +a line to add
        *** End Patch

        "*** Move to:" (optional) also renames the file. "@@" starts each change; the text
        after it (optional) is a line above the change, such as a def or class line, that
        places it. "*** End of File" after a hunk's lines ties it to the end of the file.
        Paths are relative to the workspace. Nothing is written unless every file applies.

        :param patch: the whole patch, from *** Begin Patch to *** End Patch.
        """
        from dsh_shell import patch as patches

        return patches.apply(root(), patch, unprotected, protect)

    register(edit_file, sequential=True)
    schema = build_tool(multi_edit).parameters
    schema["properties"]["edits"]["items"] = EDIT_ITEM
    register(multi_edit, parameters=schema, description=parse_docstring(multi_edit.__doc__)[0],
             sequential=True)
    register(apply_patch, sequential=True)


def register_ask(register: Callable[..., None], settings: ShellSettings) -> None:
    """Register ``ask_user``, asking on ``settings.tty``."""

    def ask_user(question: str, choices: list[str] | None = None) -> str:
        """Ask the person a question and wait for the answer (their own words, or one of
        the choices).

        Ask only what you cannot find out yourself and what matters for the result (which
        of two approaches they want, a name or value only they know); one question per
        call. When no one can answer (no terminal, or no answer given) the call fails at
        once: then decide yourself and say what you assumed.

        :param question: the question, complete and self-contained (plain text).
        :param choices: optional answers to offer, shown numbered; the person may still type
            something else.
        """
        from dsh_shell import ask

        return ask.ask(settings, question, choices)

    register(ask_user, sequential=True)


def register_search(register: Callable[..., None], settings: ShellSettings,
             policy: Policy | None = None) -> None:
    """Register ``grep``, ``glob`` and ``list_dir`` (reads: not sequential) for ``settings``'
    workspace; ``grep`` runs ``rg`` under ``policy``, made read-only."""

    def grep(pattern: str, path: str = ".", glob: str | None = None, ignore_case: bool = False,
             context: int = 0, max_results: int = 100) -> str:
        """Search file contents for a regular expression; print path:line:text, sorted.

        Skips .gitignore'd, binary and huge files, .git and symlinks.

        :param pattern: regex matched per line, e.g. "def \\w+_test".
        :param path: folder or file, relative to the workspace.
        :param glob: only files matching it, e.g. "*.py" (any depth) or "src/**/*.ts".
        :param ignore_case: case-insensitive.
        :param context: lines shown before and after each match (0-10).
        :param max_results: matching lines shown (1-1000).
        """
        from dsh_shell import grep as grepping

        return grepping.run_grep(settings, policy, pattern, path, glob, ignore_case, context,
                                 max_results)

    def glob(pattern: str, path: str = ".") -> str:
        """List the files whose paths match a glob (** for any depth), sorted.

        :param pattern: e.g. "**/*.py" or "src/*.{ts,tsx}", relative to path.
        :param path: folder to search in, relative to the workspace.
        """
        from dsh_shell import search

        return search.run_glob(settings, pattern, path)

    def list_dir(path: str = ".", depth: int = 1) -> str:
        """Show a folder as a tree: folders end in /, .gitignore'd entries are counted.

        :param path: folder relative to the workspace.
        :param depth: levels shown (1-5).
        """
        from dsh_shell import search

        return search.run_list_dir(settings, path, depth)

    register(grep)
    register(glob)
    register(list_dir)
