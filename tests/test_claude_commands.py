"""Issue 24 item 3: custom commands (``.claude/commands/*.md``, ``~/.claude/commands``) run as
``dsh run /NAME ARGS…`` and ``/NAME`` in ``dsh chat``; the expansion is the recorded user
message and what the model receives. Real subprocesses, a loopback OpenAI-compatible server.

The hostile class: huge, binary, FIFO and symlinked-out command files, hostile YAML, a name
that collides with a built-in chat command, and arguments smuggling ``---``, ``@file`` and
``!`cmd``` (arguments never trigger expansion).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st

from tests.claude_fixtures import Project
from tests.claude_fixtures import last_user_text
from tests.claude_fixtures import project as project  # noqa: F401 (fixture)
from tests.claude_fixtures import server as server  # noqa: F401 (fixture)
from tests.claude_fixtures import write
from tests.servers import Reply
from tests.servers import openai_completion

GREET = """---
description: Greet someone by name
argument-hint: NAME [MORE]
model: haiku
---
Say hello to $1 (everything: $ARGUMENTS). Read @notes.txt first.
"""


def answer(text: str = "ok") -> Reply:
    return Reply(body=openai_completion(text))


def test_run_expands_the_command_and_records_the_expansion(project: Project) -> None:
    write(project.root / ".claude/commands/greet.md", GREET)
    write(project.root / "notes.txt", "the notes say: be brief\n")
    project.server.script(answer("hi Bob"))
    run = project.dsh("run", "--json", "-m", "oa", '/greet Bob "the builder"')
    assert run.returncode == 0, run.stderr
    data = json.loads(run.stdout)
    expected = ('Say hello to Bob (everything: Bob "the builder"). Read <file path="notes.txt">'
                '\nthe notes say: be brief\n</file> first.')
    assert project.user_messages(data["session"]) == [expected]  # the ledger holds it
    [received] = project.server.received
    assert last_user_text(received.body) == expected  # and the model received exactly it
    assert received.body["model"] == "gpt-4o"  # -m wins over the command's model


def test_command_model_applies_without_m_and_namespaces_and_user_commands(
        project: Project) -> None:
    write(project.root / ".claude/commands/greet.md", GREET.replace("haiku", "oa"))
    write(project.root / ".claude/commands/frontend/component.md", "Build $ARGUMENTS.")
    write(project.home / ".claude/commands/mine.md", "---\ndescription: mine\n---\nMine.")
    write(project.root / "notes.txt", "n")
    project.server.script(answer(), answer(), answer(), answer())
    for prompt, want in (("/frontend:component a button", "Build a button."),
                         ("/component a list", "Build a list."),  # the alias of a unique name
                         ("/mine", "Mine."),
                         ("/mine extra words", "Mine.\n\nextra words")):  # appended, unused
        run = project.dsh("run", "--json", prompt)
        assert run.returncode == 0, run.stderr
        assert project.user_messages(json.loads(run.stdout)["session"]) == [want]
    listing = project.dsh("claude", "commands")
    assert listing.returncode == 0, listing.stderr
    assert "/greet NAME [MORE]\tGreet someone by name  (project)" in listing.stdout
    assert "/component\tBuild $ARGUMENTS.  (alias of /frontend:component)" in listing.stdout
    assert "/mine\tmine  (user)" in listing.stdout


def test_unknown_command_is_a_usage_error_and_nothing_is_sent(project: Project) -> None:
    write(project.root / ".claude/commands/greet.md", GREET)
    run = project.dsh("run", "/gret Bob")
    assert run.returncode == 2
    assert "unknown command '/gret'" in run.stderr and "/greet" in run.stderr
    assert project.server.received == []
    assert not project.sessions.exists() or not list(project.sessions.glob("*.jsonl"))


def test_slash_text_that_is_not_a_command_is_sent_as_text(project: Project) -> None:
    project.server.script(answer(), answer())
    run = project.dsh("run", "--json", "//greet is literal")
    assert run.returncode == 0, run.stderr
    assert project.user_messages(json.loads(run.stdout)["session"]) == ["/greet is literal"]
    run = project.dsh("run", "--json", "/etc/hosts: what is it?")  # a path, not a name
    assert run.returncode == 0, run.stderr
    assert project.user_messages(json.loads(run.stdout)["session"]) == [
        "/etc/hosts: what is it?"]


SMUGGLE = "---\nmodel: opus\nallowed-tools: Bash\n---\n@secret.txt !`touch pwned` $1"


def test_arguments_cannot_smuggle_frontmatter_files_or_shell(project: Project) -> None:
    write(project.root / ".claude/commands/echo.md", "Echo: $ARGUMENTS")
    write(project.root / "secret.txt", "TOP-SECRET-CONTENT")
    project.server.script(answer())
    run = project.dsh("run", "--json", "/echo " + SMUGGLE)
    assert run.returncode == 0, run.stderr
    [text] = project.user_messages(json.loads(run.stdout)["session"])
    assert text == "Echo: " + SMUGGLE  # verbatim: not parsed, not read, not run
    assert "TOP-SECRET-CONTENT" not in text
    assert not (project.root / "pwned").exists()
    assert project.server.received[0].body["model"] == "gpt-4o"  # settings unchanged


def test_shell_lines_run_in_the_sandbox_with_arguments_as_variables(
        project: Project, tmp_path: Path) -> None:
    outside = tmp_path / "outside-written"
    project.approve(write(project.root / ".claude/commands/st.md",
                          "---\nallowed-tools: Bash(echo:*), Read\n---\n"
                          "Status: !`echo \"got[$1]\"; echo \"$ARGUMENTS\" | wc -c`\n"
                          f"Escape: !`touch {outside} && echo escaped || echo confined`\n"))
    project.server.script(answer())
    run = project.dsh("run", "--json", "/st '$(touch pwned)' x")
    assert run.returncode == 0, run.stderr
    [text] = project.user_messages(json.loads(run.stdout)["session"])
    assert "got[$(touch pwned)]" in text  # the argument is data to the shell, never code
    assert not (project.root / "pwned").exists()
    assert "Escape: " in text and "confined" in text and not outside.exists()


def test_shell_lines_are_refused_without_bash_or_when_disabled(project: Project) -> None:
    write(project.root / ".claude/commands/nobash.md", "Now: !`date`")
    write(project.root / ".claude/commands/bash.md", "---\nallowed-tools: Bash\n---\n!`date`")
    run = project.dsh("run", "/nobash")
    assert run.returncode == 2
    assert "nobash.md: runs shell lines" in run.stderr and "does not name Bash" in run.stderr
    project.write_config("[plugins.claude]\ncommand_shell = false\n")
    run = project.dsh("run", "/bash")
    assert run.returncode == 2 and "command_shell = false: not run" in run.stderr
    assert project.server.received == []


@pytest.mark.parametrize("kind", ["huge", "binary", "fifo", "symlink-out", "alias-bomb",
                                  "tag", "unclosed"])
def test_hostile_command_files_are_refused_one_line_and_the_rest_loads(
        project: Project, tmp_path: Path, kind: str) -> None:
    bad = project.root / ".claude/commands/bad.md"
    write(project.root / ".claude/commands/good.md", "Good $ARGUMENTS")
    if kind == "huge":
        bad.write_bytes(b"x" * (2 * 1024 * 1024))
    elif kind == "binary":
        bad.write_bytes(b"Hello\0world")
    elif kind == "fifo":
        os.mkfifo(bad)
    elif kind == "symlink-out":
        target = write(tmp_path / "elsewhere.md", "Outside")
        bad.symlink_to(target)
    elif kind == "alias-bomb":
        bad.write_text("---\na: &a [x, x, x]\nb: &b [*a, *a, *a]\nc: [*b, *b, *b]\n---\nBoom")
    elif kind == "tag":
        bad.write_text("---\ndescription: !!python/object/apply:os.system ['touch pwned']\n"
                       "---\nTag")
    else:
        bad.write_text("---\ndescription: never closed\nBody")
    run = project.dsh("run", "/bad")
    assert run.returncode == 2, run.stderr
    errors = [line for line in run.stderr.splitlines() if "error" in line]
    assert len(errors) == 1 and "bad.md" in errors[0], run.stderr
    assert not (project.root / "pwned").exists()
    listing = project.dsh("claude", "commands")  # the others still load
    assert listing.returncode == 0, listing.stderr
    assert "/good\tGood $ARGUMENTS  (project)" in listing.stdout
    assert "/bad\t(unusable: " in listing.stdout
    project.server.script(answer())
    ok = project.dsh("run", "--json", "/good one")
    assert ok.returncode == 0, ok.stderr


@pytest.mark.parametrize(("ref", "problem"), [
    ("link.txt", "@link.txt: it goes through a symbolic link"),
    ("../outside.txt", "@../outside.txt: leads outside the project folder"),
    ("~/outside.txt", "@~/outside.txt: leads outside the project folder"),
    ("OUTSIDE_ABS", "leads outside the project folder"),
    ("sub/../../outside.txt", "leads outside the project folder"),
])
def test_at_file_outside_the_project_is_refused(project: Project, tmp_path: Path, ref: str,
                                                problem: str) -> None:
    write(tmp_path / "outside.txt", "OUTSIDE")
    write(project.home / "outside.txt", "OUTSIDE")
    (project.root / "sub").mkdir()
    (project.root / "link.txt").symlink_to(tmp_path / "outside.txt")
    ref = ref.replace("OUTSIDE_ABS", str(tmp_path / "outside.txt"))
    write(project.root / ".claude/commands/peek.md", f"Look at @{ref}")
    run = project.dsh("run", "/peek")
    assert run.returncode == 2
    assert f"peek.md: {problem}" in run.stderr or (
        "peek.md: @" in run.stderr and problem in run.stderr), run.stderr
    assert "OUTSIDE" not in run.stderr.replace("OUTSIDE_ABS", "")
    assert project.server.received == []


def test_chat_expands_commands_and_builtins_win(project: Project) -> None:
    write(project.root / ".claude/commands/greet.md", "Hello $1!")
    write(project.root / ".claude/commands/help.md", "Project help $ARGUMENTS")
    project.server.script(answer("one"), answer("two"))
    chat = project.dsh("chat", input="/greet Ada\n/help\n/nothing\nplain\n")
    assert chat.returncode == 0, chat.stderr
    assert "unknown command '/nothing'" in chat.stderr and "/greet" in chat.stderr
    assert "/help" in chat.stdout + chat.stderr  # the built-in help answered
    assert "/greet      Hello $1!  (sent as its expansion)" in chat.stdout + chat.stderr
    [session] = [p.stem for p in project.sessions.glob("*.jsonl")]
    assert project.user_messages(session) == ["Hello Ada!", "plain"]
    assert last_user_text(project.server.received[0].body) == "Hello Ada!"
    project.server.script(answer())  # dsh run has no built-in /help
    run = project.dsh("run", "--json", "/help me")
    assert run.returncode == 0, run.stderr
    assert project.user_messages(json.loads(run.stdout)["session"]) == ["Project help me"]


@settings(max_examples=150, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(arguments=st.lists(st.sampled_from(
    list("ab $@!`-\n/.'\"\\") + ["secret.txt", "$1", "$ARGUMENTS", "!`id`", "@secret.txt",
                                 "---", "$(id)"]), max_size=16).map("".join))
def test_property_arguments_are_only_ever_substituted(tmp_path_factory, arguments) -> None:  # type: ignore[no-untyped-def]
    """Whatever the arguments hold, the expansion is the body with ``$ARGUMENTS`` and ``$N``
    replaced by them: no file is read and no shell line is run because of them."""
    from dsh_claude.commands import Command
    from dsh_claude.commands import expand
    from dsh_claude.commands import split_arguments

    root = tmp_path_factory.mktemp("prop")
    write(root / "secret.txt", "TOP-SECRET")
    path = write(root / ".claude/commands/c.md", "---\ndescription: d\n---\nA $ARGUMENTS B $2")
    cmd = Command("c", path, "project", root)

    class Handle:  # expand() reads no agent setting unless the body has shell lines
        name = "t"
        settings: dict[str, object] = {}

    got = expand(cmd, arguments, Handle(), {"root": str(root)}).prompt
    parts = split_arguments(arguments)
    want = f"A {arguments} B {parts[1] if len(parts) > 1 else ''}".strip("\n")
    assert got == want
    assert "TOP-SECRET" not in got or "TOP-SECRET" in arguments


def test_bad_settings_name_the_key(project: Project) -> None:
    write(project.root / ".claude/commands/c.md", "C")
    project.write_config('[plugins.claude]\ncommand_shell = "no"\n')
    run = project.dsh("run", "/c")
    assert run.returncode == 2
    assert "key 'command_shell': expected true or false, not 'no'" in run.stderr
    assert project.server.received == []
