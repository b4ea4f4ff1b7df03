"""Docs match the code: the hook reference, the events reference."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import attrs

from dsh.host.manager import make_plugin_manager
from dsh.ledger.events import EVENT_TYPES

DOCS = Path(__file__).parent.parent / "docs"


def _gen_hooks():
    sys.path.insert(0, str(DOCS))
    try:
        import gen_hooks
    finally:
        sys.path.remove(str(DOCS))
    return gen_hooks


def test_hooks_md_is_generated_from_hookspecs():
    gen = _gen_hooks()
    assert (DOCS / "hooks.md").read_text() == gen.render(), (
        "docs/hooks.md is stale: run `python docs/gen_hooks.py > docs/hooks.md`"
    )


def test_every_hook_is_documented_with_its_signature():
    gen = _gen_hooks()
    text = (DOCS / "hooks.md").read_text()
    pm = make_plugin_manager()
    names = [n for n in dir(pm.hook) if not n.startswith("_")]
    assert len(names) >= 14
    for name in names:
        assert f"### `{gen.signature(name)}`" in text, f"hook {name} missing from hooks.md"


def test_events_md_lists_every_type_and_field():
    text = (DOCS / "events.md").read_text()
    documented = re.findall(r"^### `([a-z/-]+)` — `(\w+)`", text, re.M)
    assert sorted(documented) == sorted((c.type, c.__name__) for c in EVENT_TYPES)
    sections = re.split(r"^### ", text, flags=re.M)
    for cls in EVENT_TYPES:
        body = next(s for s in sections if s.startswith(f"`{cls.type}`"))
        table = set(re.findall(r"^\| `(\w+)` \|", body, re.M))
        fields = {f.name for f in attrs.fields(cls)} - {"seq", "ts", "session", "extra"}
        assert table == fields, f"{cls.type}: docs {sorted(table)} vs code {sorted(fields)}"


def _commands(group, path=("dsh",)):  # type: ignore[no-untyped-def]
    import click

    yield " ".join(path), group
    if isinstance(group, click.Group):
        for name in group.list_commands(click.Context(group)):
            yield from _commands(group.get_command(click.Context(group), name), (*path, name))


def test_cli_md_documents_every_command_and_option():
    """docs/cli.md has a section per command, headed `` `dsh …` ``, naming every option."""
    from dsh.cli.root import cli

    text = (DOCS / "cli.md").read_text()
    sections = dict(re.findall(r"^#{2,4} `(dsh[^`]*)`\n(.*?)(?=^#{2,3} `dsh|\Z)", text,
                               re.M | re.S))
    seen = []
    for path, command in _commands(cli):
        assert path in sections, f"docs/cli.md has no section for `{path}`"
        seen.append(path)
        for param in command.params:
            for opt in getattr(param, "opts", []):
                if opt.startswith("-") and opt != "--help":
                    assert f"`{opt}" in sections[path], f"`{path}`: option {opt} undocumented"
    assert sorted(seen) == sorted(sections), "docs/cli.md documents commands that do not exist"


def test_events_md_lists_every_outcome_and_live_event():
    from dsh.ledger.events import OUTCOMES
    from dsh.run.recorder import LIVE_EVENTS

    text = (DOCS / "events.md").read_text()
    outcome_row = next(line for line in text.splitlines() if line.startswith("| `outcome` |"))
    assert all(f"`{o}`" in outcome_row for o in OUTCOMES)
    section = text.split("## Live events")[1].split("\n## ")[0]
    live_rows = set(re.findall(r"^\| `([a-z]+/[a-z-]+)` \|", section, re.M))
    assert live_rows == set(LIVE_EVENTS)


def test_events_md_documents_the_plugin_event_family():
    """``x/PLUGIN/NAME`` is a family, not one tag (not in EVENT_TYPES): its section lists
    every field of :class:`~dsh.ledger.events.PluginEvent` and the limits the code enforces."""
    from dsh.ledger import plugin_events
    from dsh.ledger.events import PluginEvent

    text = (DOCS / "events.md").read_text()
    [body] = [s for s in re.split(r"^### ", text, flags=re.M)
              if s.startswith("`x/PLUGIN/NAME` — `PluginEvent`")]
    table = set(re.findall(r"^\| `(\w+)` \|", body, re.M))
    fields = {f.name for f in attrs.fields(PluginEvent)} - {"seq", "ts", "session", "extra"}
    assert table == fields
    assert plugin_events.MAX_DATA_BYTES == 64 * 1024 and "64 KiB" in body
    assert f"nested at most {plugin_events.MAX_DEPTH} levels" in body
    assert f"1–{plugin_events.MAX_NAME} characters" in body
    assert "`x/PLUGIN/NAME` | nothing" in text  # the projection table


# -- reference tables of the objects hooks receive (issue 11) ---------------------------------

_NOT_CLASSES = {"Any", "Callable", "None", "str", "int", "list", "tuple", "dict", "bool", "type",
                "click", "Group"}


def _names(annotation: str) -> set[str]:
    return set(re.findall(r"[A-Za-z_]\w*", annotation)) - _NOT_CLASSES


def test_reference_covers_every_class_a_hook_receives_or_returns():
    import inspect

    from dsh import hookspecs

    gen = _gen_hooks()
    documented = {public.rsplit(".", 1)[1] for public, _ in gen.REFERENCE}
    named: set[str] = set()
    for name in dir(make_plugin_manager().hook):
        if name.startswith("_"):
            continue
        sig = inspect.signature(getattr(hookspecs, name))
        named |= _names(str(sig.return_annotation))
        for p in sig.parameters.values():
            named |= _names(str(p.annotation))
    missing = named - documented - set(gen.NOT_DOCUMENTED)
    assert not missing, f"hook objects without a reference table in gen_hooks.REFERENCE: {missing}"
    assert {"StepDraft", "ModelCall", "ModelRequest", "ModelResponse", "ToolInvocation",
            "ToolOutcome", "Turn", "AgentHandle", "RunContext", "CompactionRequest",
            "Compaction", "Usage", "ToolCall", "Message"} <= documented


def test_reference_covers_the_attrs_classes_its_attributes_name():
    """A new attrs class reachable from a hook object (``ModelResponse.reasoning`` ->
    ``Reasoning``) gets a table, or a reason in ``NOT_DOCUMENTED``."""
    import importlib
    import pkgutil

    import dsh

    gen = _gen_hooks()
    attrs_classes: dict[str, type] = {}
    for mod in pkgutil.walk_packages(dsh.__path__, "dsh."):
        if mod.name == "dsh.__main__":
            continue
        try:
            module = importlib.import_module(mod.name)
        except ImportError:  # an optional provider dependency
            continue
        for value in vars(module).values():
            if isinstance(value, type) and attrs.has(value) and value.__module__ == mod.name:
                attrs_classes[value.__name__] = value
    documented = {public.rsplit(".", 1)[1] for public, _ in gen.REFERENCE}
    for public, spec in gen.REFERENCE:
        for row in gen.rows(gen._resolve(spec)):
            for name in _names(row.type) & set(attrs_classes):
                assert name in documented or name in gen.NOT_DOCUMENTED, (
                    f"{public}.{row.name} is a {name}, which has no reference table")


def test_reference_tables_list_every_public_attribute(tmp_path, monkeypatch):
    """The generator reads attributes from the class itself: a new field shows up without
    touching the generator, and one without a ``#:`` comment fails loudly."""
    (tmp_path / "dsh_refcheck.py").write_text('''
from __future__ import annotations
import attrs

@attrs.frozen
class Documented:
    """A value."""

    #: The first.
    first: int
    second: str = ""  #: The second, commented on its line.
    _private: int = 0

    @property
    def both(self) -> str:
        """Both, as text."""
        return f"{self.first}{self.second}"

@attrs.define
class Mutable:
    """A box."""

    #: Set me.
    value: int = 0
    forgotten: int = 0

class Slots:
    """Plain."""

    __slots__ = ("name", "_hidden")

    def __init__(self, name: str) -> None:
        #: Its name.
        self.name = name
        self._hidden = 1
''')
    monkeypatch.syspath_prepend(str(tmp_path))
    import dsh_refcheck

    gen = _gen_hooks()
    rows = gen.rows(dsh_refcheck.Documented)
    assert [(r.name, r.type, r.mutability, r.meaning) for r in rows] == [
        ("first", "int", "frozen", "The first."),
        ("second", "str", "frozen", "The second, commented on its line."),
        ("both", "str", "read-only property", "Both, as text."),
    ]
    assert [(r.name, r.type, r.mutability) for r in gen.rows(dsh_refcheck.Slots)] == [
        ("name", "str", "mutable")]
    import pytest

    with pytest.raises(gen.UndocumentedAttribute, match=r"Mutable: public attribute\(s\) "
                                                        r"forgotten have no meaning"):
        gen.rows(dsh_refcheck.Mutable)


def test_hooks_md_has_a_table_per_reference_class_with_every_attribute():
    gen = _gen_hooks()
    text = (DOCS / "hooks.md").read_text()
    for public, spec in gen.REFERENCE:
        section = text.split(f"### `{public}`\n", 1)[1].split("\n### ", 1)[0]
        listed = re.findall(r"^\| `([^`]+)` \|", section, re.M)
        cls = gen._resolve(spec)
        if attrs.has(cls):
            public_fields = [f.name for f in attrs.fields(cls) if not f.name.startswith("_")]
            assert listed[:len(public_fields)] == public_fields, public
        assert listed, public


def test_every_first_party_distribution_accepts_this_dsh() -> None:
    """Each plugin's (and the example's) requirement on dsh admits this version: pip installs
    them together in .ci/run, where a plugin asking for a later dsh makes the whole install
    fail (tests install plugins with --no-deps and would not notice)."""
    import tomllib

    from packaging.requirements import Requirement

    from dsh import __version__

    root = Path(__file__).parents[1]
    found = 0
    projects = [*root.glob("plugins/*/pyproject.toml"), *root.glob("examples/*/pyproject.toml")]
    for project in projects:
        deps = tomllib.loads(project.read_text())["project"].get("dependencies", [])
        for dep in map(Requirement, deps):
            if dep.name == "dsh-agents":
                found += 1
                assert dep.specifier.contains(__version__, prereleases=True), (
                    f"{project.relative_to(root)}: {dep} excludes dsh {__version__}")
    assert found >= 6
