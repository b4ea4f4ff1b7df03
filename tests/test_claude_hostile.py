"""dsh-claude against hostile project files: huge, binary, FIFO, symlink out, YAML bombs and
tags, import loops and escapes, name collisions, resource path escapes — each refused with one
line naming the file (and key or line), the rest still loads. Property-based where wide."""

from __future__ import annotations

import os
import string
from pathlib import Path

import pytest
from hypothesis import HealthCheck
from hypothesis import given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

pytest.importorskip("dsh_claude", reason="pip install ./plugins/dsh-claude")

from dsh_claude import frontmatter  # noqa: E402
from dsh_claude import instructions  # noqa: E402
from dsh_claude import skills  # noqa: E402
from dsh_claude.frontmatter import ClaudeFileError  # noqa: E402
from dsh_claude.settings import ConfigError  # noqa: E402
from dsh_claude.settings import Settings  # noqa: E402
from dsh_claude.settings import parse_settings  # noqa: E402


def skill(folder: Path, name: str, front: str | None = None, body: str = "Body.\n") -> Path:
    (folder / name).mkdir(parents=True, exist_ok=True)
    text = front if front is not None else f"name: {name}\ndescription: Does {name}.\n"
    path = folder / name / "SKILL.md"
    path.write_text(f"---\n{text}---\n{body}")
    return path


# ------------------------------------------------------------------------ the bounded reader


def test_reader_refuses_huge_binary_fifo_directory_and_symlink_out(tmp_path: Path) -> None:
    root = tmp_path / "proj"
    root.mkdir()
    (root / "huge.md").write_bytes(b"a" * (frontmatter.MAX_FILE + 1))
    (root / "bin.md").write_bytes(b"text\0more")
    (root / "latin.md").write_bytes(b"caf\xe9")
    os.mkfifo(root / "fifo.md")
    (root / "dir.md").mkdir()
    (tmp_path / "secret.md").write_text("SECRET")
    (root / "out.md").symlink_to(tmp_path / "secret.md")
    (root / "dev.md").symlink_to("/dev/zero")
    (root / "loop.md").symlink_to(root / "loop.md")
    cases = {"huge.md": f"the limit is {frontmatter.MAX_FILE}", "bin.md": "binary (a NUL byte",
             "latin.md": "not UTF-8 text (byte 3)", "fifo.md": "is a FIFO",
             "dir.md": "is a directory", "out.md": "symbolic link", "dev.md": "symbolic link",
             "loop.md": "symbolic link", "missing.md": "does not exist"}
    for name, expected in cases.items():
        with pytest.raises(ClaudeFileError) as info:
            frontmatter.read_text(root / name, [root])
        message = str(info.value)
        assert message.startswith(f"{root / name}: ") and expected in message, message
        assert "\n" not in message and "SECRET" not in message
        assert info.value.exit_code == 2
    (root / "in.md").symlink_to(root / "ok.md")
    (root / "ok.md").write_text("\ufeffhello")
    assert frontmatter.read_text(root / "ok.md", [root]) == "hello"
    with pytest.raises(ClaudeFileError, match="symbolic link"):  # even one that stays inside
        frontmatter.read_text(root / "in.md", [root])
    with pytest.raises(ClaudeFileError, match="leads outside the folders"):
        frontmatter.read_text(root / ".." / "secret.md", [root])


# ------------------------------------------------------------------------ YAML


BOMB = "---\n" + "a0: &a0 [x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"a{i}: &a{i} [*a{i - 1}, *a{i - 1}, *a{i - 1}, *a{i - 1}, *a{i - 1}, *a{i - 1}]\n"
    for i in range(1, 12)) + "---\nbody\n"


@pytest.mark.parametrize(("text", "expected"), [
    (BOMB, "line 2: the frontmatter has an anchor (&a0)"),
    ("---\nname: *x\n---\n", "line 2: the frontmatter has an alias (*x)"),
    ("---\nname: !!python/object/apply:os.system [echo hi]\n---\n", "has a tag"),
    ("---\nname: !custom x\n---\n", "has a tag (!custom)"),
    ("---\nname: !!str x\n---\n", "has a tag"),
    ("---\nname: a\nname: b\n---\n", "line 3: key 'name' is given twice"),
    ("---\n[a]: b\n---\n", "a key must be text, not a list"),
    ("---\n- a\n- b\n---\n", "must be a mapping of keys, not a list"),
    ("---\njust text\n---\n", "must be a mapping of keys, not text"),
    ("---\nname: [\n---\n", "invalid YAML in the frontmatter"),
    ("---\nname: a\n", "line 1: the frontmatter opened by '---' is never closed"),
    ("---\nx: " + "[" * 50 + "]" * 50 + "\n---\n", "nesting deeper than 16 levels"),
    ("---\nx: " + "a" * (frontmatter.MAX_FRONTMATTER + 1) + "\n---\n", "the limit is"),
])
def test_hostile_frontmatter_is_one_line_naming_file_and_line(text: str, expected: str) -> None:
    with pytest.raises(ClaudeFileError) as info:
        frontmatter.parse(text, "x/SKILL.md")
    message = str(info.value)
    assert message.startswith("x/SKILL.md: ") and expected in message, message
    assert "\n" not in message


def test_frontmatter_is_strings_only() -> None:
    doc = frontmatter.parse("---\nname: no\nn: 1.5\nd: 2024-01-01\nl: [on, off]\nm: {a: ~}\n"
                            "---\n# Body\n", "f")
    assert doc.meta == {"name": "no", "n": "1.5", "d": "2024-01-01", "l": ["on", "off"],
                        "m": {"a": "~"}}
    assert doc.body == "# Body\n" and doc.body_line == 8
    assert frontmatter.parse("no frontmatter\n---\n", "f").meta == {}


@hsettings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.text(alphabet=string.printable + "&*!%@|>-:[]{}#\u00e9\u2028", max_size=300))
def test_any_frontmatter_parses_to_plain_data_or_one_clear_error(block: str) -> None:
    try:
        doc = frontmatter.parse(f"---\n{block}\n---\nbody\n", "p/SKILL.md")
    except ClaudeFileError as exc:
        assert str(exc).startswith("p/SKILL.md: ") and "\n" not in str(exc)
        return

    def plain(v: object) -> bool:
        if isinstance(v, str):
            return True
        if isinstance(v, list):
            return all(plain(x) for x in v)
        return isinstance(v, dict) and all(isinstance(k, str) and plain(x)
                                           for k, x in v.items())

    assert plain(doc.meta)


# ------------------------------------------------------------------------ skills


def test_skill_validation_names_file_and_key(tmp_path: Path) -> None:
    root = tmp_path / "skills"
    skill(root, "good-one")
    skill(root, "Bad_Name", "name: Bad_Name\ndescription: d\n")
    skill(root, "other", "name: not-other\ndescription: d\n")
    skill(root, "no-desc", "name: no-desc\n")
    skill(root, "long-desc", "name: long-desc\ndescription: " + "w" * 1025 + "\n")
    skill(root, "help", "name: help\ndescription: d\n")
    skill(root, "bad-md", "name: bad-md\ndescription: d\nmetadata: [a]\n")
    skill(root, "bomb", BOMB.split("---\n")[1])
    skill(root, "git-tools", "name: git-tools\ndescription: d\n"
                             "allowed-tools: Bash(git add:*), Read mcp__x__y\n")
    cat = skills.discover_skills([root])
    assert [s["name"] for s in cat.skills] == ["git-tools", "good-one"]  # by folder name
    assert cat.skills[0]["allowed_tools"] == ["run_command", "read_file", "mcp__x__y"]
    assert cat.skills[1]["allowed_tools"] is None
    problems = {Path(p["path"]).parent.name: p["problem"] for p in cat.problems}
    assert "key 'name'" in problems["Bad_Name"] and "lowercase" in problems["Bad_Name"]
    assert "does not match its folder 'other'" in problems["other"]
    assert "key 'description': missing" in problems["no-desc"]
    assert "key 'description': 1025 characters" in problems["long-desc"]
    assert "built-in name" in problems["help"]
    assert "key 'metadata'" in problems["bad-md"]
    assert "anchor" in problems["bomb"]


def test_name_collisions_keep_the_first(tmp_path: Path) -> None:
    project, user = tmp_path / "p", tmp_path / "u"
    skill(project, "deploy", body="PROJECT\n")
    skill(user, "deploy", body="USER\n")
    skill(user, "lint")
    cat = skills.discover_skills([skills.SkillRoot(project, "project"),
                                  skills.SkillRoot(user, "user")])
    assert [(s["name"], s["source"]) for s in cat.skills] == [("deploy", "project"),
                                                              ("lint", "user")]
    assert cat.problems[0]["path"] == str(user / "deploy" / "SKILL.md")
    assert "already the skill" in cat.problems[0]["problem"]


def test_skill_symlinked_out_and_fifo_are_skipped(tmp_path: Path) -> None:
    root = tmp_path / "skills"
    outside = tmp_path / "elsewhere"
    skill(outside, "evil")
    root.mkdir()
    (root / "evil").symlink_to(outside / "evil")
    (root / "pipe").mkdir()
    os.mkfifo(root / "pipe" / "SKILL.md")
    skill(root, "fine")
    cat = skills.discover_skills([root])
    assert [s["name"] for s in cat.skills] == ["fine"]
    problems = " | ".join(p["problem"] for p in cat.problems)
    assert "symbolic link" in problems and "is a FIFO" in problems


@hsettings(max_examples=200, deadline=None,
           suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.sampled_from(["..", ".", "a", "ref.md", "/", "out", "link", "~", "",
                                 "%2e%2e", "sub"]), min_size=1, max_size=6))
def test_resource_paths_never_escape(tmp_path: Path, parts: list[str]) -> None:
    folder = tmp_path / "skill"
    if not folder.exists():
        (folder / "sub").mkdir(parents=True)
        (folder / "ref.md").write_text("INSIDE")
        (folder / "sub" / "ref.md").write_text("INSIDE")
        (tmp_path / "out").write_text("OUTSIDE")
        (folder / "link").symlink_to(tmp_path / "out")
    path = "/".join(parts)
    try:
        text = skills.read_inside(folder, path)
    except ClaudeFileError as exc:
        assert "OUTSIDE" not in str(exc)
        return
    assert text == "INSIDE"


# ------------------------------------------------------------------------ imports


def collect(root: Path, home: Path) -> tuple[list[dict], dict[str, str]]:  # type: ignore[type-arg]
    return instructions.collect(Settings(user_agents_md="", user_claude_md=""), root, root,
                                home)


def test_import_loops_escapes_and_depth(tmp_path: Path) -> None:
    root, home = tmp_path / "proj", tmp_path / "home"
    root.mkdir()
    home.mkdir()
    (tmp_path / "secret.md").write_text("SECRET")
    (root / "CLAUDE.md").write_text("top @a.md and @../secret.md and @/etc/passwd\n")
    (root / "a.md").write_text("A imports @b.md\n")
    (root / "b.md").write_text("B imports @a.md and @c1.md\n")
    for i in range(1, 8):
        (root / f"c{i}.md").write_text(f"C{i} @c{i + 1}.md\n")
    (root / "c8.md").write_text("C8\n")
    used, texts = collect(root, home)
    joined = "\n".join(texts.values())
    assert "SECRET" not in joined and "root:" not in joined
    problems = {e["path"]: e["problem"] for e in used if "problem" in e}
    assert any("import loop" in p for p in problems.values()), problems
    assert any("leads outside" in p for p in problems.values()), problems
    assert any("import depth limit (5)" in p for p in problems.values()), problems
    paths = [e["path"] for e in used if "problem" not in e]
    assert paths[:4] == ["CLAUDE.md", "a.md", "b.md", "c1.md"]
    assert "c8.md" not in paths  # past the depth bound
    assert len(paths) == len(set(paths))


def test_settings_are_checked() -> None:
    with pytest.raises(ConfigError, match="key 'agents_md': expected true or false"):
        parse_settings({"agents_md": "yes"}, "plugins.claude")
    with pytest.raises(ConfigError, match="unknown key 'skill'"):
        parse_settings({"skill": []}, "plugins.claude")
    with pytest.raises(ConfigError, match="key 'skills': expected a list"):
        parse_settings({"skills": "x"}, "plugins.claude")
    off = parse_settings({"enabled": False}, "w")
    assert not off.any_instructions and not off.agent_skills


@hsettings(max_examples=60, deadline=None,
           suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(st.integers(0, 5), st.sampled_from(
    ["f0.md", "f1.md", "f2.md", "f3.md", "f4.md", "f5.md", "../out.md", "/etc/hostname",
     "~/h.md", "missing.md", "link.md"])), max_size=20))
def test_any_import_graph_terminates_within_bounds(tmp_path: Path,
                                                   edges: list[tuple[int, str]]) -> None:
    """Random imports among six files, a file outside, one in home, a symlink out: collect
    ends, reads nothing from outside the project (home included), includes each file once, and
    every problem is one line naming the file."""
    import shutil

    base = tmp_path / "g"
    shutil.rmtree(base, ignore_errors=True)
    root, home = base / "proj", base / "home"
    root.mkdir(parents=True)
    home.mkdir()
    (base / "out.md").write_text("OUTSIDE")
    (home / "h.md").write_text("HOME")
    (root / "link.md").symlink_to(base / "out.md")
    refs: dict[int, list[str]] = {i: [] for i in range(6)}
    for src, ref in edges:
        refs[src].append(ref)
    for i in range(6):
        (root / f"f{i}.md").write_text(f"F{i} " + " ".join(f"@{r}" for r in refs[i]) + "\n")
    (root / "CLAUDE.md").write_text("top @f0.md\n")
    used, texts = instructions.collect(Settings(user_agents_md="", user_claude_md=""), root,
                                       root, home)
    assert "OUTSIDE" not in "".join(texts.values())
    assert "HOME" not in "".join(texts.values())
    paths = [e["path"] for e in used if "problem" not in e]
    assert len(paths) == len(set(paths)) <= 8
    for e in used:
        if "problem" in e:
            assert "\n" not in e["problem"]


def test_allowed_tools_apply_until_the_end_of_the_turn() -> None:
    state = skills.reduce(skills.INITIAL, {"op": "catalogue", "problems": [], "skills": [
        {"name": "narrow", "allowed_tools": ["read_file"]},
        {"name": "wide", "allowed_tools": None}]})
    assert skills.refusal(state, 1, "run_command") is None  # nothing loaded
    state = skills.reduce(state, {"op": "load", "name": "wide", "turn": 1})
    assert skills.refusal(state, 1, "run_command") is None  # no allowed-tools: no narrowing
    state = skills.reduce(state, {"op": "load", "name": "narrow", "turn": 1})
    why = skills.refusal(state, 1, "run_command")
    assert why is not None and "narrow" in why and "read_file" in why
    assert skills.refusal(state, 1, "read_file") is None
    assert skills.refusal(state, 1, "skill_file") is None
    assert skills.refusal(state, 2, "run_command") is None  # the next turn: not active
    state = skills.reduce(state, {"op": "load", "name": "wide", "turn": 2})
    assert [a["turn"] for a in state["active"]] == [2]  # older turns' loads are dropped
    with pytest.raises(ValueError, match="no skill 'ghost'"):
        skills.reduce(state, {"op": "load", "name": "ghost", "turn": 2})
