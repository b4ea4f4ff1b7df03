"""Docs match the code: the hook reference, the events reference."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import attrs

from dsh.events import EVENT_TYPES
from dsh.manager import make_plugin_manager

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
    from dsh.cli import cli

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
    from dsh.events import OUTCOMES
    from dsh.recorder import LIVE_EVENTS

    text = (DOCS / "events.md").read_text()
    outcome_row = next(line for line in text.splitlines() if line.startswith("| `outcome` |"))
    assert all(f"`{o}`" in outcome_row for o in OUTCOMES)
    section = text.split("## Live events")[1].split("\n## ")[0]
    live_rows = set(re.findall(r"^\| `([a-z]+/[a-z-]+)` \|", section, re.M))
    assert live_rows == set(LIVE_EVENTS)
