"""Which command lines need a shell, and which of those run at once: a Bash parse, not a guess.

Under the kernel sandbox ``run_command`` runs a line that uses shell syntax as ``bash -c``
(:mod:`dsh_shell.commands`). Whether such a line may run without approval is decided here, on
the syntax tree that tree-sitter's Bash grammar (``tree-sitter-bash``) makes of it — the
grammar of the shell that runs it. The walk is an allowlist of node types: anything it does
not know (arithmetic, ``[[ … ]]``, declarations, a construct of a newer grammar) makes the line
one to ask about, never one that runs at once.

A line is *read-only* — it runs at once, as an allowlisted program does — only when:

* every command in it, in pipelines, lists, subshells, ``{ …; }``, ``if``/``while``/``case``
  bodies, command and process substitutions and heredocs alike, is named by a plain word on
  the allowlist (by name; a path only when it is the file PATH finds), and none is a builtin
  that runs code or changes the shell (``eval``, ``exec``, ``source``, ``.``, ``trap``,
  ``printf -v``'s ``printf``, ``hash``, ``cd``…) whatever the allowlist says;
* no output goes to a file: ``>``, ``>>``, ``>|``, ``&>`` only to ``/dev/null`` (or
  ``/dev/stdout``, ``/dev/stderr``); ``2>&1``, ``>&2`` and reading with ``<`` are fine;
  ``<>`` opens for writing;
* no command's name is computed (``$CMD args``, ``$(echo rm) x``, ``"ls"``);
* no variable is set (``X=1``; ``PATH=/tmp ls``: a prefix only for ``LANG``, ``LC_*``,
  ``TZ``, ``NO_COLOR`` and ``COLUMNS``; ``${X:=y}``) and no function is defined;
* no arithmetic (``$(( ))``, ``(( ))``, ``[[ … -eq … ]]``, ``${X:offset}``, ``${a[i]}``):
  Bash evaluates a variable's value there as an expression, and an array subscript in it
  runs commands (``x='a[$(rm -rf .)]'; echo $((x))``); a ``for`` loop's variable is a
  lower-case name;
* the line parses: any ``ERROR`` or missing node means it needs approval.

Imported when the first command line that needs a shell is classified, never at start-up
(tree-sitter and its grammar take ~30 ms to load).
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable
from typing import Any
from typing import NamedTuple

#: Characters that mean something to a shell. A line without any (and without a reserved
#: word or an assignment as its first word) means the same split by :func:`shlex.split` as
#: by Bash, so it runs as one program, without a shell.
SPECIAL = frozenset("|&;<>()$`\\*?[]{}~#\n\r")
#: Words Bash reads as syntax when they come first.
RESERVED = frozenset({"!", "[[", "]]", "{", "}", "case", "coproc", "do", "done", "elif",
                      "else", "esac", "fi", "for", "function", "if", "in", "select", "then",
                      "time", "until", "while"})
#: Builtins that run code, change the shell's state (variables, PATH lookups, the directory,
#: traps, options, descriptors) or read input: never "read-only", even when allowlisted.
STATEFUL = frozenset({
    "eval", "exec", "source", ".", "trap", "enable", "builtin", "command", "alias",
    "unalias", "set", "shopt", "hash", "read", "mapfile", "readarray", "printf", "getopts",
    "let", "declare", "typeset", "local", "export", "readonly", "unset", "cd", "pushd",
    "popd", "umask", "ulimit", "fc", "history", "bind", "complete", "compgen", "compopt",
    "coproc", "wait", "kill", "jobs", "fg", "bg", "disown", "suspend", "caller", "shift",
})
#: Variables a prefix assignment may set in a read-only line (they change messages, colours
#: and time zones, never what runs).
SAFE_PREFIX = re.compile(r"(LANG|LANGUAGE|LC_[A-Z]+|TZ|NO_COLOR|COLUMNS)\Z")
#: Where output may go in a read-only line.
NULL_SINKS = frozenset({"/dev/null", "/dev/stdout", "/dev/stderr"})
#: Node types that are only structure: what they hold is walked, they add nothing.
STRUCTURE = frozenset({
    "program", "list", "pipeline", "redirected_statement", "subshell", "negated_command",
    "comment", "if_statement", "elif_clause", "else_clause", "while_statement", "do_group",
    "case_statement", "case_item", "command_substitution", "process_substitution",
    "heredoc_redirect", "heredoc_body", "heredoc_start", "heredoc_content", "heredoc_end",
    "herestring_redirect", "word", "string", "raw_string", "string_content", "ansi_c_string",
    "translated_string", "concatenation", "number", "brace_expression", "variable_name",
    "special_variable_name", "file_descriptor", "simple_expansion", "extglob_pattern",
})
_OUTPUT = frozenset({">", ">>", ">|", "&>", "&>>"})
_LOOP_VARIABLE = re.compile(r"[a-z_][a-z0-9_]*\Z")

_parser: Any = None
_parser_lock = threading.Lock()


class Analysis(NamedTuple):
    """What a command line runs and why it needs approval."""

    #: The names of the commands it runs, as written, each once, in order.
    programs: tuple[str, ...]
    #: Why it needs approval (empty: it is read-only and runs at once).
    problems: tuple[str, ...]

    @property
    def read_only(self) -> bool:
        return not self.problems


def needs_shell(command: str, argv: list[str] | None) -> bool:
    """Whether ``command`` (split by shlex as ``argv``, None when shlex could not) uses
    shell syntax: a special character, a reserved word or an assignment first."""
    if argv is None:
        return True
    if SPECIAL.intersection(command):
        return True
    return bool(argv) and (argv[0] in RESERVED or "=" in argv[0])


def parser() -> Any:
    """The Bash parser, made once (importing tree-sitter here, not at start-up)."""
    global _parser
    if _parser is None:
        with _parser_lock:
            if _parser is None:
                import tree_sitter
                import tree_sitter_bash

                _parser = tree_sitter.Parser(tree_sitter.Language(tree_sitter_bash.language()))
    return _parser


def analyze(command: str, check: Callable[[str], str | None]) -> Analysis:
    """Classify ``command``: ``check(name)`` says why a command named ``name`` needs
    approval (None: it is allowlisted)."""
    tree = parser().parse(command.encode("utf-8", "surrogateescape"))
    walk = _Walk(check)
    walk.visit(tree.root_node)
    if tree.root_node.has_error:
        walk.problem("the line does not parse as Bash (a syntax error)")
    return Analysis(tuple(dict.fromkeys(walk.programs)), tuple(dict.fromkeys(walk.problems)))


def _text(node: Any) -> str:
    return bytes(node.text or b"").decode("utf-8", "replace")


def _short(text: str, limit: int = 60) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


class _Walk:
    def __init__(self, check: Callable[[str], str | None]) -> None:
        self.check = check
        self.programs: list[str] = []
        self.problems: list[str] = []

    def problem(self, text: str) -> None:
        self.problems.append(text)

    def visit(self, root: Any) -> None:
        stack = [root]
        while stack:
            node = stack.pop()
            kids = self.node(node)
            stack.extend(reversed(kids))

    def node(self, node: Any) -> list[Any]:
        """Check ``node``; return the children still to walk."""
        if node.is_error or node.is_missing:
            return []  # reported once, for the whole tree (has_error)
        if not node.is_named:  # a token: '|', '&&', ';', '$(', 'do'
            return []
        kind = node.type
        handler = _HANDLERS.get(kind)
        if handler is not None:
            return handler(self, node)
        if kind in STRUCTURE:
            return list(node.children)
        self.problem(_UNKNOWN.get(kind, f"uses {kind.replace('_', ' ')}") +
                     f" ({_short(_text(node))})")
        return []

    # -- handlers --------------------------------------------------------------------------

    def command(self, node: Any) -> list[Any]:
        rest = []
        named = [c for c in node.children if c.type == "command_name"]
        for child in node.children:
            if child.type == "variable_assignment":
                self.assignment(child, prefix=bool(named))
            elif child.type != "command_name":
                rest.append(child)
        if not named:
            return rest
        name_node = named[0]
        inner = [c for c in name_node.children if c.is_named]
        if len(inner) == 1 and inner[0].type == "word":
            name = _text(inner[0])
            self.programs.append(name)
            if name in STATEFUL:
                self.problem(f"{name} is a shell builtin that runs code or changes the shell")
            else:
                why = self.check(name)
                if why is not None:
                    self.problem(f"{name} is {why}" if why.startswith("not ") else
                                 f"{name}: {why}")
        else:
            shown = _short(_text(name_node))
            self.programs.append(shown)
            self.problem(f"the command's name ({shown}) is not a plain word: what it runs is "
                         "known only when it runs")
            rest = inner + rest  # a $(...) in the name still counts
        return rest

    def assignment(self, node: Any, prefix: bool) -> None:
        names = [c for c in node.children if c.type in ("variable_name", "subscript")]
        name = _text(names[0]) if names else "?"
        if prefix and names and names[0].type == "variable_name" and SAFE_PREFIX.match(name):
            self._values(node)
            return
        what = f"sets {name} for the command" if prefix else f"sets the shell variable {name}"
        self.problem(f"{what} ({_short(_text(node))})")
        self._values(node)

    def _values(self, node: Any) -> None:
        for child in node.children:  # the value's substitutions are walked all the same
            if child.is_named and child.type not in ("variable_name", "subscript"):
                self.visit(child)

    def variable_assignment(self, node: Any) -> list[Any]:  # a statement of its own
        self.assignment(node, prefix=False)
        return []

    def redirect(self, node: Any) -> list[Any]:
        ops = [c.type for c in node.children if not c.is_named]
        targets = [c for c in node.children if c.is_named and c.type != "file_descriptor"]
        op = ops[0] if ops else ""
        target = targets[-1] if targets else None
        shown = _short(_text(node))
        if op in ("<", ">&-", "<&-") or (op in (">&", "<&") and target is not None and (
                target.type == "number" or _text(target) == "-")):
            pass  # reading a file, or duplicating/closing a descriptor
        elif op in _OUTPUT or op == ">&":
            if target is None or not (target.type == "process_substitution" or (
                    target.type == "word" and _text(target) in NULL_SINKS)):
                self.problem(f"writes to a file ({shown})")
        else:
            self.problem(f"uses the redirection {op or '?'} ({shown})")
        return [c for c in node.children if c.is_named]

    def expansion(self, node: Any) -> list[Any]:
        # ${NAME} and ${#NAME} only: operators assign (${X:=y}) or evaluate arithmetic
        # (${X:1}, ${a[i]}).
        inner = [c for c in node.children if c.type not in ("${", "}")]
        plain = [c.type for c in inner] in (["variable_name"], ["special_variable_name"],
                                            ["#", "variable_name"])
        if not plain:
            self.problem(f"uses a parameter expansion with an operator ({_short(_text(node))})")
        return []

    def for_statement(self, node: Any) -> list[Any]:
        names = [c for c in node.children if c.type == "variable_name"]
        if names and not _LOOP_VARIABLE.match(_text(names[0])):
            self.problem(f"sets the shell variable {_text(names[0])} (for loop)")
        return [c for c in node.children if c.is_named and c.type != "variable_name"]

    def compound_statement(self, node: Any) -> list[Any]:
        first = node.children[0].type if node.children else ""
        if first != "{":  # (( … )): arithmetic
            self.problem(f"uses arithmetic ({_short(_text(node))})")
            return []
        return list(node.children)

    def function_definition(self, node: Any) -> list[Any]:
        self.problem(f"defines a function ({_short(_text(node))})")
        return []


_HANDLERS: dict[str, Callable[[_Walk, Any], list[Any]]] = {
    "command": _Walk.command,
    "variable_assignment": _Walk.variable_assignment,
    "file_redirect": _Walk.redirect,
    "expansion": _Walk.expansion,
    "for_statement": _Walk.for_statement,
    "compound_statement": _Walk.compound_statement,
    "function_definition": _Walk.function_definition,
}
#: How the problem of a node type outside :data:`STRUCTURE` is said.
_UNKNOWN = {
    "arithmetic_expansion": "uses arithmetic, which can run commands through a variable's value",
    "test_command": "uses [[ … ]], whose arithmetic can run commands through a variable's value",
    "c_style_for_statement": "uses arithmetic (a C-style for loop)",
    "declaration_command": "declares or exports a variable",
    "unset_command": "unsets a variable",
    "variable_assignments": "sets shell variables",
}
