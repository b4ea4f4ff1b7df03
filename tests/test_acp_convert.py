"""dsh-acp's conversions: a tool's ACP kind, which paths are shown, and the ``diff`` content
rebuilt from a recorded change — whole texts while the file holds what the tool wrote, the
diff's hunks otherwise, nothing outside the workspace (a hostile ledger or model)."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("dsh_acp")

from dsh_acp import convert  # noqa: E402

from dsh.tools.changes import record  # noqa: E402


def test_tool_kinds() -> None:
    assert [convert.tool_kind(n) for n in (
        "read_file", "write_file", "edit_file", "apply_patch", "grep", "glob", "run_command",
        "web_fetch", "update_tasks", "mcp__git__delete_branch", "mcp__fs__move_file",
        "ask_user")] == ["read", "edit", "edit", "edit", "search", "search", "execute", "fetch",
                         "think", "delete", "move", "other"]


def test_paths_outside_the_workspace_are_never_shown(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    start = convert.tool_start("c1", "write_file", {"path": "../../etc/passwd"}, str(ws))
    assert start.locations is None and start.title == "write_file: ../../etc/passwd"
    assert convert.inside(str(ws), "/etc/passwd") is None
    assert convert.inside(str(ws), "a/../../x") is None
    assert convert.inside(str(ws), "a/b.txt") == str(ws / "a" / "b.txt")
    outside = {"path": "../secret.txt", "op": "update", "diff": "@@ -1 +1 @@\n-a\n+b\n"}
    done = convert.tool_done("c1", "write_file", "ok", "done", [outside], str(ws))
    assert [c.type for c in done.content] == ["content"]


def test_diff_content_whole_then_hunks(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    before = "".join(f"line {i}\n" for i in range(20))
    after = before.replace("line 10\n", "line ten\n")
    change = record("f.txt", before.encode(), after.encode())
    (ws / "f.txt").write_text(after)
    diff = convert.diff_content(change, str(ws))
    assert diff is not None and (diff.old_text, diff.new_text) == (before, after)
    (ws / "f.txt").write_text(after + "edited since\n")  # not what the tool wrote: the hunks
    diff = convert.diff_content(change, str(ws))
    assert diff is not None
    assert diff.old_text == "".join(f"line {i}\n" for i in range(7, 14))
    assert diff.new_text == diff.old_text.replace("line 10\n", "line ten\n")
    created = convert.diff_content(record("new.txt", None, b"hello\n"), str(ws))
    assert created is not None and (created.old_text, created.new_text) == (None, "hello\n")
    gone = convert.diff_content(record("f.txt", before.encode(), None), str(ws))
    assert gone is not None and (gone.old_text, gone.new_text) == (before, "")


def test_a_symlink_planted_later_is_not_read(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    secret = tmp_path / "secret.txt"
    secret.write_text("after\n")
    change = record("f.txt", b"before\n", b"after\n")
    (ws / "f.txt").symlink_to(secret)  # the same bytes, but outside the workspace
    diff = convert.diff_content(change, str(ws))
    assert diff is not None and (diff.old_text, diff.new_text) == ("before\n", "after\n")
    assert diff.path == str(ws / "f.txt")


def test_a_write_question_as_a_diff(tmp_path: Path) -> None:
    from dsh.tools.approval import Ask
    from dsh.tools.changes import diff_of

    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "f.txt").write_text("a\nb\n")

    def ask(subject: str, detail: str) -> Ask:
        return Ask(tool="write_file", action="write", subject=subject, root=str(ws),
                   detail=detail)

    shown = convert.ask_diff(ask("f.txt", diff_of("a\nb\n", "a\nc\n", "f.txt").rstrip("\n")))
    assert shown is not None and (shown.old_text, shown.new_text) == ("a\nb\n", "a\nc\n")
    new = convert.ask_diff(ask("n.txt", diff_of("", "x\n", "n.txt", created=True)))
    assert new is not None and (new.old_text, new.new_text) == (None, "x\n")
    long = diff_of("", "".join(f"{i}\n" for i in range(100)), "n.txt", created=True)
    cut = "\n".join([*long.splitlines()[:40], "… (62 more lines of diff)"])
    assert convert.ask_diff(ask("n.txt", cut)) is None  # only the start: not shown as a diff
    assert convert.ask_diff(ask("../f.txt", diff_of("", "x\n", "f.txt"))) is None
    (ws / "f.txt").write_text("changed since\n")
    assert convert.ask_diff(ask("f.txt", diff_of("a\nb\n", "a\nc\n", "f.txt"))) is None
