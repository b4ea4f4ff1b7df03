"""Generate docs/hooks.md from dsh/hookspecs.py (the docstrings are the contract) and from
the classes of the objects hooks receive (their ``#:`` attribute comments).

    python docs/gen_hooks.py > docs/hooks.md

tests/test_docs.py fails when docs/hooks.md differs from this output.
"""

from __future__ import annotations

import ast
import inspect
import re
import textwrap

import attrs

from dsh import hookspecs

INTRO = """\
# Hook reference

Every hook dsh calls, generated from `dsh/hookspecs.py` by `python docs/gen_hooks.py`
(tests/test_docs.py keeps the two in sync). Hooks are called with keyword arguments; an
implementation names only the arguments it needs, and must not give them defaults. Mark
implementations with `dsh.hookimpl` (the pluggy marker of project `dsh`).

Kinds: **collect** hooks return nothing and take a `register` callback; **firstresult** hooks
stop at the first implementation that returns a value (the built-in one is `trylast`, so any
plugin wins); **wrappers** (`@hookimpl(wrapper=True)`) are welcome on `request` and `execute`,
the two onion chains; **historic** hooks reach plugins registered late and cannot be wrapped.
"""


def _section(source: str) -> list[tuple[str, list[str]]]:
    """Banner comment titles in order, with the hook names under each."""
    sections: list[tuple[str, list[str]]] = []
    lines = source.splitlines()
    for i, line in enumerate(lines):
        if line.startswith("# ---") and i + 1 < len(lines) and lines[i + 1].startswith("# ") \
                and not lines[i + 1].startswith("# ---"):
            sections.append((lines[i + 1][2:].strip(), []))
        m = re.match(r"def (\w+)\(", line)
        if m and sections:
            sections[-1][1].append(m.group(1))
    return sections


def signature(name: str) -> str:
    fn = getattr(hookspecs, name)
    sig = inspect.signature(fn)
    params = ", ".join(f"{p.name}: {p.annotation}" for p in sig.parameters.values())
    return f"{name}({params}) -> {sig.return_annotation}"


def kind(name: str) -> str:
    opts = getattr(getattr(hookspecs, name), "dsh_spec", {})
    kinds = [k for k in ("firstresult", "historic") if opts.get(k)]
    return ", ".join(kinds) or "all results"


def render() -> str:
    out = [INTRO]
    source = inspect.getsource(hookspecs)
    for title, names in _section(source):
        out.append(f"\n## {title}\n")
        for name in names:
            doc = inspect.cleandoc(getattr(hookspecs, name).__doc__ or "")
            out.append(f"### `{signature(name)}`\n")
            out.append(f"*Kind: {kind(name)}.*\n")
            out.append(doc.replace(".. versionadded::", "Added in version") + "\n")
    out.append("\n" + render_objects())
    return "\n".join(out).rstrip() + "\n"


# --------------------------------------------------------------------------------------------
# Reference tables of the objects hooks receive or return (issue 11)
# --------------------------------------------------------------------------------------------

#: Every object a hook receives or returns, and those reachable from their attributes that a
#: plugin reads, in the order the reference shows them: ``(public name, defining class)``.
#: tests/test_docs.py checks that every class named in a hook's signature is here, and that
#: the dsh attrs classes these objects' attributes name are here or in ``NOT_DOCUMENTED``.
REFERENCE = (
    ("dsh.AgentHandle", "dsh.host.scope:AgentHandle"),
    ("dsh.Stash", "dsh.host.stash:Stash"),
    ("dsh.run.loop.StepDraft", "dsh.run.loop:StepDraft"),
    ("dsh.run.loop.InboxItem", "dsh.run.loop:InboxItem"),
    ("dsh.llm.builtin.ModelCall", "dsh.llm.builtin:ModelCall"),
    ("dsh.core.messages.ModelRequest", "dsh.core.messages:ModelRequest"),
    ("dsh.core.messages.ModelResponse", "dsh.core.messages:ModelResponse"),
    ("dsh.core.messages.Message", "dsh.core.messages:Message"),
    ("dsh.core.messages.ToolCall", "dsh.core.messages:ToolCall"),
    ("dsh.core.messages.Usage", "dsh.core.messages:Usage"),
    ("dsh.core.messages.Reasoning", "dsh.core.messages:Reasoning"),
    ("dsh.core.messages.Attachment", "dsh.core.messages:Attachment"),
    ("dsh.core.messages.ToolSpec", "dsh.core.messages:ToolSpec"),
    ("dsh.core.messages.Change", "dsh.core.messages:Change"),
    ("dsh.tools.registry.ToolInvocation", "dsh.tools.registry:ToolInvocation"),
    ("dsh.tools.registry.ToolDef", "dsh.tools.registry:ToolDef"),
    ("dsh.tools.registry.ToolOutcome", "dsh.tools.registry:ToolOutcome"),
    ("dsh.run.loop.Turn", "dsh.run.loop:Turn"),
    ("dsh.RunContext", "dsh.host.runcontext:RunContext"),
    ("dsh.run.compaction.CompactionRequest", "dsh.run.compaction:CompactionRequest"),
    ("dsh.run.compaction.Compaction", "dsh.run.compaction:Compaction"),
)

#: dsh attrs classes named by attributes above that the reference leaves out, and why.
NOT_DOCUMENTED = {
    "App": "the library API (docs/architecture.md); plugins use `app.config`, `app.stash`",
    "Budget": "the run's counters (docs/execution.md, \"Budgets\")",
    "Limits": "budget limits (docs/config.md)",
    "CancelToken": "cancellation; its use in plugins is in docs/plugin-tools.md",
    "PluginManager": "pluggy's (pluggy's docs): `configure` may `register(obj, name=...)` a "
                     "helper in it, once (`get_plugin(name)`)",
    "pluggy": "the module of `PluginManager`",
}

OBJECTS_INTRO = """\
## Objects hooks receive and return

Generated from the classes themselves: an attribute's meaning is its `#:` comment in the
source (or its property's docstring), its type is its annotation. **Mutability**: *frozen* —
the object cannot be changed in place (build a new one with `attrs.evolve`); *mutable* — a
plugin may set it, and what it sets is what dsh uses; *read-only property* — computed, cannot
be set; *method* — call it. Every object a hook runs with for an agent reaches the agent's
[`AgentHandle`](#dshagenthandle) as `.handle`.
"""


class UndocumentedAttribute(Exception):
    """A public attribute of a reference class has no ``#:`` comment (or docstring)."""


def _resolve(spec: str) -> type:
    import importlib

    module, _, name = spec.partition(":")
    cls: type = getattr(importlib.import_module(module), name)
    return cls


def _doc_summary(doc: str | None) -> str:
    """The first paragraph of a docstring, on one line."""
    text = inspect.cleandoc(doc or "")
    return " ".join(text.split("\n\n")[0].split())


def _comment_above(lines: list[str], lineno: int) -> str:
    """The ``#:`` comment block right above line ``lineno`` (1-based), or trailing on it."""
    line = lines[lineno - 1]
    if "#:" in line and not line.lstrip().startswith("#"):
        return line.split("#:", 1)[1].strip()
    block: list[str] = []
    i = lineno - 2
    while i >= 0 and lines[i].lstrip().startswith("#:"):
        block.insert(0, lines[i].lstrip()[2:].strip())
        i -= 1
    return " ".join(block).strip()


@attrs.frozen
class Row:
    """One line of a reference table."""

    name: str
    type: str
    mutability: str
    meaning: str


def _members(cls: type) -> tuple[dict[str, tuple[str, str]], dict[str, Row]]:
    """From the source of ``cls`` and its dsh bases: ``{attribute: (annotation, comment)}``
    of annotated class attributes and ``self.X`` assignments in ``__init__``, and the rows of
    public properties and methods."""
    fields: dict[str, tuple[str, str]] = {}
    extra: dict[str, Row] = {}
    for klass in reversed(cls.__mro__):
        if not klass.__module__.startswith("dsh"):
            continue
        source = textwrap.dedent(inspect.getsource(klass))
        lines = source.splitlines()
        node = ast.parse(source).body[0]
        assert isinstance(node, ast.ClassDef)
        # Properties with a ``@NAME.setter`` are mutable.
        setters = {f.name for f in node.body if isinstance(f, ast.FunctionDef)
                   for d in f.decorator_list if isinstance(d, ast.Attribute)
                   and d.attr == "setter"}
        for stmt in node.body:
            if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
                ann = ast.get_source_segment(source, stmt.annotation) or ""
                fields[stmt.target.id] = (ann, _comment_above(lines, stmt.lineno))
            elif isinstance(stmt, ast.FunctionDef) and stmt.name == "__init__":
                params = {a.arg: ast.get_source_segment(source, a.annotation) or ""
                          for a in stmt.args.args + stmt.args.kwonlyargs if a.annotation}
                for sub in ast.walk(stmt):
                    target = (sub.targets[0] if isinstance(sub, ast.Assign)
                              else sub.target if isinstance(sub, ast.AnnAssign) else None)
                    if not (isinstance(target, ast.Attribute) and isinstance(
                            target.value, ast.Name) and target.value.id == "self"):
                        continue
                    if isinstance(sub, ast.AnnAssign):
                        ann = ast.get_source_segment(source, sub.annotation) or ""
                    else:
                        value = sub.value
                        ann = params.get(value.id, "") if isinstance(value, ast.Name) else ""
                    fields[target.attr] = (ann, _comment_above(lines, sub.lineno))
            elif isinstance(stmt, ast.FunctionDef) and not stmt.name.startswith("_"):
                decorators = {ast.unparse(d) for d in stmt.decorator_list}
                if any(d.endswith(".setter") for d in decorators):
                    continue
                doc = _doc_summary(ast.get_docstring(stmt))
                if "property" in decorators:
                    ann = ast.get_source_segment(source, stmt.returns) if stmt.returns else ""
                    kind = "mutable" if stmt.name in setters else "read-only property"
                    extra[stmt.name] = Row(stmt.name, ann or "", kind, doc)
                else:
                    args = ast.unparse(stmt.args).removeprefix("self").lstrip(", ")
                    extra[stmt.name] = Row(f"{stmt.name}({args})", "", "method", doc)
    return fields, extra


def _frozen(cls: type) -> bool:
    return getattr(cls.__setattr__, "__name__", "") == "_frozen_setattrs"


def rows(cls: type) -> list[Row]:
    """The reference rows of ``cls``: its public attributes in definition order, then its
    public properties and methods. Raises :class:`UndocumentedAttribute` for one without a
    meaning."""
    fields, extra = _members(cls)
    out: list[Row] = []
    if attrs.has(cls):
        frozen = _frozen(cls)
        for f in attrs.fields(cls):
            if f.name.startswith("_"):
                continue
            ann, meaning = fields.get(f.name, ("", ""))
            fixed = frozen or f.on_setattr is attrs.setters.frozen
            out.append(Row(f.name, ann, "frozen" if fixed else "mutable", meaning))
    else:
        for name, (ann, meaning) in fields.items():
            if not name.startswith("_"):
                out.append(Row(name, ann, "mutable", meaning))
    out.extend(extra.values())
    missing = [r.name for r in out if not r.meaning]
    if missing:
        where = f"{cls.__module__}.{cls.__qualname__}"
        raise UndocumentedAttribute(
            f"{where}: public attribute(s) {', '.join(missing)} have no meaning: add a `#:` "
            "comment above the field (or a docstring to the property or method)")
    return out


_ROLE = re.compile(r":(?:class|meth|func|attr|data|mod|exc):`~?([^`]+)`")


def _md(text: str) -> str:
    """reST inline markup as Markdown, safe in a table cell."""
    text = _ROLE.sub(r"`\1`", text).replace("``", "`")
    return text.replace("|", "\\|")


def render_objects() -> str:
    out = [OBJECTS_INTRO]
    for public, spec in REFERENCE:
        cls = _resolve(spec)
        kind = ("Frozen attrs class" if attrs.has(cls) and _frozen(cls)
                else "Mutable attrs class" if attrs.has(cls) else "Class")
        out.append(f"### `{public}`\n")
        out.append(f"*{kind}.* {_md(inspect.cleandoc(cls.__doc__ or ''))}\n")
        out.append("| attribute | type | mutability | meaning |")
        out.append("|---|---|---|---|")
        for r in rows(cls):
            typ = f"`{_md(r.type)}`" if r.type else ""
            out.append(f"| `{_md(r.name)}` | {typ} | {r.mutability} | {_md(r.meaning)} |")
        out.append("")
    return "\n".join(out)


if __name__ == "__main__":
    print(render(), end="")
