"""The workbench's exact-match edit tools, ``edit_file`` and ``multi_edit`` (dsh_shell.edit),
observed from outside: what is on disk afterwards, the Change recorded on the tool result,
and the error the model reads when an edit cannot be made.

The installed dsh-shell is used (as tests/test_shell_plugin.py does); no test prompts a
terminal (``tty`` points at a path that cannot be opened).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck
from hypothesis import assume
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st

from dsh.core.errors import ToolError
from dsh.core.messages import ToolCall
from dsh.ledger.events import ToolReturned
from dsh.run.app import App
from dsh.tools.registry import ToolInvocation
from dsh.tools.registry import execute

edit = pytest.importorskip("dsh_shell.edit")


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    """The workspace; ``tmp_path/outside.txt`` is a file outside it."""
    root = tmp_path / "ws"
    root.mkdir()
    (root / "notes.txt").write_text("one\ntwo\nthree\n")
    (tmp_path / "outside.txt").write_text("outside, keep me\n")
    return root


@pytest.fixture
def make(tmp_path: Path, ws: Path) -> Callable[..., App]:
    def build(**shell: Any) -> App:
        return App.from_config({
            "sessions_dir": str(tmp_path / "sessions"),
            "plugins": {"shell": {"workspace": str(ws), "tty": str(tmp_path / "no-tty"),
                                  **shell}},
            "agents": {"a": {"plugins": ["shell"]}},
        })

    return build


@pytest.fixture
def app(make: Callable[..., App]) -> App:
    return make()


def fn(app: App, name: str) -> Callable[..., str]:
    return app.agent("a").tools[name].fn


def turn(app: App, script: Callable[..., str], *calls: tuple[str, dict[str, Any]],
         approve: bool = True) -> list[ToolReturned]:
    """One real turn in which the scripted model makes ``calls``; their results."""
    model = script({"tool_calls": [{"name": n, "arguments": a} for n, a in calls]},
                   {"text": "done"})
    run = app.run("go", agent="a", model=model, approve=approve)
    assert run.outcome == "completed", run
    return [e for e in app.store.read(run.session_id) if isinstance(e, ToolReturned)]


def errors_of(call: Callable[[], Any]) -> str:
    with pytest.raises(ToolError) as err:
        call()
    return str(err.value)


# -- registration and a real turn ------------------------------------------------------------------


def test_the_edit_tools_are_registered_sequential_with_their_schemas(app: App) -> None:
    tools = app.agent("a").tools
    for name in ("edit_file", "multi_edit", "apply_patch"):
        assert tools[name].sequential and tools[name].plugin == "shell", name
    assert tools["edit_file"].parameters["required"] == ["path", "old", "new"]
    item = tools["multi_edit"].parameters["properties"]["edits"]["items"]
    assert item["required"] == ["old", "new"] and item["additionalProperties"] is False
    assert tools["multi_edit"].description.startswith("Make several exact replacements")
    assert "*** Begin Patch" in tools["apply_patch"].description


def test_an_edit_in_a_turn_writes_the_file_and_records_its_change(
        app: App, ws: Path, script: Callable[..., str]) -> None:
    [result] = turn(app, script, ("edit_file", {"path": "notes.txt", "old": "two",
                                                "new": "2"}))
    assert result.status == "ok"
    diff = "--- a/notes.txt\n+++ b/notes.txt\n@@ -1,3 +1,3 @@\n one\n-two\n+2\n three\n"
    assert result.output == "edited notes.txt (1 replacement)\n" + diff.rstrip("\n")
    [change] = result.changes
    assert (change.op, change.path, change.added, change.removed, change.diff) == (
        "update", "notes.txt", 1, 1, diff)
    assert (ws / "notes.txt").read_text() == "one\n2\nthree\n"


def test_without_a_terminal_in_ask_mode_the_edit_is_refused_and_nothing_recorded(
        app: App, ws: Path, script: Callable[..., str]) -> None:
    [result] = turn(app, script, ("edit_file", {"path": "notes.txt", "old": "two",
                                                "new": "2"}), approve=False)
    assert result.status == "error" and "edit_file was not run" in result.output
    assert result.changes == () and (ws / "notes.txt").read_text() == "one\ntwo\nthree\n"


def test_a_bad_multi_edit_item_is_refused_by_its_schema(
        app: App, ws: Path, script: Callable[..., str]) -> None:
    [result] = turn(app, script, ("multi_edit", {"path": "notes.txt", "edits": [
        {"old": "two", "new": "2", "replace": True}]}))
    assert result.status == "error"
    assert "arguments.edits[0]: unexpected argument 'replace'" in result.output
    assert (ws / "notes.txt").read_text() == "one\ntwo\nthree\n"


# -- matching --------------------------------------------------------------------------------------


def test_several_matches_are_refused_with_their_count_and_lines(app: App, ws: Path) -> None:
    (ws / "f.txt").write_text("x = 1\ny\nx = 1\nz\nx = 1\n")
    message = errors_of(lambda: fn(app, "edit_file")(path="f.txt", old="x = 1", new="x = 2"))
    assert message.startswith("old matches 3 places in f.txt (at lines 1, 3, 5)")
    assert "replace_all=true" in message
    assert (ws / "f.txt").read_text() == "x = 1\ny\nx = 1\nz\nx = 1\n"
    # overlapping matches are as ambiguous as separate ones
    (ws / "g.txt").write_text("aaa\n")
    assert "old matches 2 places in g.txt (at lines 1, 1)" in errors_of(
        lambda: fn(app, "edit_file")(path="g.txt", old="aa", new="b"))
    # a long list of lines is cut
    (ws / "h.txt").write_text("k\n" * 12)
    assert "(at lines 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, …)" in errors_of(
        lambda: fn(app, "edit_file")(path="h.txt", old="k", new="v"))


def test_replace_all_replaces_every_match_and_counts_them(app: App, ws: Path) -> None:
    (ws / "f.txt").write_text("x = 1\ny\nx = 1\n")
    out = fn(app, "edit_file")(path="f.txt", old="x = 1", new="x = 2", replace_all=True)
    assert out.startswith("edited f.txt (2 replacements)\n--- a/f.txt")
    assert (ws / "f.txt").read_text() == "x = 2\ny\nx = 2\n"


def test_a_missing_match_says_so_and_points_at_a_near_one(app: App, ws: Path) -> None:
    (ws / "f.py").write_text("def f():\n\treturn  1\n")
    edit_file = fn(app, "edit_file")
    assert errors_of(lambda: edit_file(path="f.py", old="nothing like it", new="x")) == \
        "old was not found in f.py"
    message = errors_of(lambda: edit_file(path="f.py", old="def f():\n    return 1", new="x"))
    assert message.startswith("old was not found in f.py; text that differs from it only in "
                              "whitespace")
    assert "starts at line 1" in message
    message = errors_of(lambda: edit_file(path="f.py", old="return 1", new="x"))
    assert "starts at line 2" in message
    assert (ws / "f.py").read_text() == "def f():\n\treturn  1\n"


@pytest.mark.parametrize(("old", "new", "message"), [
    ("two", "two", "old and new are the same text"),
    ("", "x", "old is empty: give the exact text to replace in notes.txt (to create or "
              "overwrite a whole file, use write_file)"),
    ("two\r\n", "two\n", "old and new differ only in line endings"),
])
def test_edits_that_change_nothing_are_refused(app: App, ws: Path, old: str, new: str,
                                               message: str) -> None:
    assert message in errors_of(lambda: fn(app, "edit_file")(path="notes.txt", old=old,
                                                              new=new))
    assert (ws / "notes.txt").read_text() == "one\ntwo\nthree\n"


# -- what the model does not see: endings, BOM, encoding -------------------------------------------


def test_a_crlf_file_is_matched_with_lf_text_and_keeps_its_endings(app: App, ws: Path) -> None:
    (ws / "w.txt").write_bytes(b"one\r\ntwo\r\nthree\r\n")
    out = fn(app, "edit_file")(path="w.txt", old="one\ntwo\n", new="1\n1.5\n2\n")
    assert out.startswith("edited w.txt (1 replacement)")
    assert (ws / "w.txt").read_bytes() == b"1\r\n1.5\r\n2\r\nthree\r\n"
    # text sent with CRLF matches it too, and new LF text still gets CRLF
    fn(app, "edit_file")(path="w.txt", old="three\r\n", new="3\nend\n")
    assert (ws / "w.txt").read_bytes() == b"1\r\n1.5\r\n2\r\n3\r\nend\r\n"


def test_crlf_text_for_an_lf_file_is_given_the_files_endings(app: App, ws: Path) -> None:
    fn(app, "edit_file")(path="notes.txt", old="one\r\ntwo", new="1\r\n2")
    assert (ws / "notes.txt").read_bytes() == b"1\n2\nthree\n"
    fn(app, "edit_file")(path="notes.txt", old="three", new="3\r\n4")
    assert (ws / "notes.txt").read_bytes() == b"1\n2\n3\n4\n"


def test_a_file_mixing_endings_is_matched_exactly_and_says_when_it_cannot(
        app: App, ws: Path) -> None:
    (ws / "m.txt").write_bytes(b"a\r\nb\nc\r\n")
    message = errors_of(lambda: fn(app, "edit_file")(path="m.txt", old="a\nb", new="x"))
    assert "m.txt mixes CRLF and LF line endings, and old matches at line 1 only with its " \
           "endings ignored" in message
    assert (ws / "m.txt").read_bytes() == b"a\r\nb\nc\r\n"
    fn(app, "edit_file")(path="m.txt", old="a\r\nb\n", new="x\n")
    assert (ws / "m.txt").read_bytes() == b"x\nc\r\n"


def test_a_bom_is_kept_and_never_part_of_the_match(app: App, ws: Path) -> None:
    (ws / "b.txt").write_bytes(b"\xef\xbb\xbfhello\nworld\n")
    fn(app, "edit_file")(path="b.txt", old="hello\n", new="bye\n")
    assert (ws / "b.txt").read_bytes() == b"\xef\xbb\xbfbye\nworld\n"


def test_a_latin1_file_is_edited_as_latin1(app: App, ws: Path) -> None:
    (ws / "l.txt").write_bytes("caf\xe9 cr\xe8me\n".encode("latin-1"))
    edit_file = fn(app, "edit_file")
    edit_file(path="l.txt", old="cr\xe8me", new="br\xfbl\xe9e")
    assert (ws / "l.txt").read_bytes() == "caf\xe9 br\xfbl\xe9e\n".encode("latin-1")
    message = errors_of(lambda: edit_file(path="l.txt", old="caf", new="\u20ac"))
    assert "l.txt is not UTF-8, so it is kept in latin-1, which has no '€' (U+20AC)" in message
    # what read_file showed of it (U+FFFD for the bytes that are not UTF-8) is explained
    message = errors_of(lambda: edit_file(path="l.txt", old="caf\ufffd", new="x"))
    assert "read_file showed its non-UTF-8 bytes as U+FFFD" in message
    assert (ws / "l.txt").read_bytes() == "caf\xe9 br\xfbl\xe9e\n".encode("latin-1")


def test_binary_files_are_refused(app: App, ws: Path) -> None:
    (ws / "bin.dat").write_bytes(b"\x7fELF\0\0abc")
    assert "'bin.dat' looks like a binary file" in errors_of(
        lambda: fn(app, "edit_file")(path="bin.dat", old="abc", new="x"))
    assert (ws / "bin.dat").read_bytes() == b"\x7fELF\0\0abc"


def test_a_huge_file_is_refused_without_being_read(app: App, ws: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    huge = ws / "huge.log"
    with open(huge, "wb") as f:
        f.truncate(100 << 20)  # sparse: 100 MB that cost nothing on disk
    read = os.read
    seen: list[int] = []

    def counting(fd: int, n: int) -> bytes:
        data = read(fd, n)
        seen.append(len(data))
        return data

    monkeypatch.setattr(os, "read", counting)
    start = time.monotonic()
    message = errors_of(lambda: fn(app, "edit_file")(path="huge.log", old="a", new="b"))
    assert time.monotonic() - start < 2
    assert message.startswith(f"'huge.log' is too large to edit ({100 << 20} bytes;")
    assert sum(seen) == 0


def test_missing_files_directories_and_fifos_are_refused(app: App, ws: Path) -> None:
    edit_file = fn(app, "edit_file")
    assert "no such file in the workspace: 'ghost.txt'" in errors_of(
        lambda: edit_file(path="ghost.txt", old="a", new="b"))
    (ws / "sub").mkdir()
    assert "'sub' is a directory" in errors_of(lambda: edit_file(path="sub", old="a", new="b"))
    os.mkfifo(ws / "pipe")
    assert "'pipe' is a FIFO, not a regular file" in errors_of(
        lambda: edit_file(path="pipe", old="a", new="b"))


# -- paths -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(("path", "message"), [
    ("../outside.txt", "leaves the workspace through '..'"),
    ("sub/../../outside.txt", "leaves the workspace through '..'"),
    ("{tmp}/outside.txt", "absolute paths are refused"),
    ("to-outside", "goes through a symlink that leads outside the workspace"),
    ("outdir/outside.txt", "goes through a symlink that leads outside the workspace"),
])
@pytest.mark.parametrize("tool", ["edit_file", "multi_edit"])
def test_paths_out_of_the_workspace_are_refused(app: App, ws: Path, tmp_path: Path, path: str,
                                                message: str, tool: str) -> None:
    (ws / "to-outside").symlink_to(tmp_path / "outside.txt")
    (ws / "outdir").symlink_to(tmp_path)
    (ws / "sub").mkdir()
    args: dict[str, Any] = {"old": "outside", "new": "pwned"}
    if tool == "multi_edit":
        args = {"edits": [args]}
    assert message in errors_of(lambda: fn(app, tool)(path=path.format(tmp=tmp_path), **args))
    assert (tmp_path / "outside.txt").read_text() == "outside, keep me\n"


def test_a_symlink_inside_the_workspace_edits_its_target(app: App, ws: Path) -> None:
    (ws / "alias").symlink_to("notes.txt")
    out = fn(app, "edit_file")(path="alias", old="two", new="2")
    assert "--- a/notes.txt\n+++ b/notes.txt" in out  # the diff names the real file
    assert (ws / "notes.txt").read_text() == "one\n2\nthree\n" and (ws / "alias").is_symlink()


@pytest.mark.parametrize("path", [".git/hooks/pre-commit", ".mcp.json", "AGENTS.md",
                                  ".claude/settings.json"])
def test_persistence_paths_are_refused(app: App, ws: Path, path: str) -> None:
    target = ws / path
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text("echo hi\n")
    for tool, args in (("edit_file", {"old": "hi", "new": "pwned"}),
                       ("multi_edit", {"edits": [{"old": "hi", "new": "pwned"}]})):
        message = errors_of(lambda: fn(app, tool)(path=path, **args))  # noqa: B023
        assert "a file that shapes later runs" in message and f"{tool} does not change" \
            in message
    assert target.read_text() == "echo hi\n"


# -- stale reads and writes that waited ------------------------------------------------------------


def test_an_edit_of_a_file_changed_since_it_was_read_says_so(app: App, ws: Path) -> None:
    edit_file = fn(app, "edit_file")
    edit.remember_read(str(ws), "notes.txt", (ws / "notes.txt").read_bytes())
    (ws / "notes.txt").write_text("one\ntwo\nthree\nfour\n")  # another program writes it
    out = edit_file(path="notes.txt", old="two", new="2")
    assert out.endswith("\nnote: notes.txt changed on disk since you last read it (another "
                        "program or person wrote it): what you know of it may be out of "
                        "date; read it again if unsure")
    # the edit's own write is what the model knows now: no note for the next edit
    assert "note:" not in edit_file(path="notes.txt", old="four", new="4")
    (ws / "notes.txt").write_text("rewritten\n")
    message = errors_of(lambda: edit_file(path="notes.txt", old="4", new="four"))
    assert message.startswith("old was not found in notes.txt")
    assert "notes.txt changed on disk since you last read it" in message


def test_stale_reads_are_kept_per_session(app: App, ws: Path,
                                          script: Callable[..., str]) -> None:
    call = {"tool_calls": [{"name": "edit_file", "arguments": {
        "path": "notes.txt", "old": "one", "new": "1"}}]}
    back = {"tool_calls": [{"name": "edit_file", "arguments": {
        "path": "notes.txt", "old": "1", "new": "one"}}]}
    model = script(call, {"text": "a"}, back, {"text": "b"}, call, {"text": "c"})
    with app.session("a", model=model) as session:
        session.send("first", approve=True)
        (ws / "notes.txt").write_text("1\ntwo\nthree\nfour\n")  # someone else writes it
        sid = session.send("second", approve=True).session_id
    results = [e for e in app.store.read(sid) if isinstance(e, ToolReturned)]
    assert [r.status for r in results] == ["ok", "ok"]
    assert "note:" not in results[0].output
    assert "notes.txt changed on disk since you last read it" in results[1].output
    # another session never saw the file: no note
    with app.session("a", model=model) as other:
        sid = other.send("third", approve=True).session_id
    [third] = [e for e in app.store.read(sid) if isinstance(e, ToolReturned)]
    assert third.status == "ok" and "note:" not in third.output


def test_a_file_changed_while_approval_waited_is_left_alone(
        app: App, ws: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from dsh.tools import approval

    def person_takes_long(ask: Any) -> Any:
        (ws / "notes.txt").write_text("their change\n")
        return approval.Decision(True, "person", "approved")

    monkeypatch.setattr(approval, "request", person_takes_long)
    message = errors_of(lambda: fn(app, "edit_file")(path="notes.txt", old="two", new="2"))
    assert message.startswith("'notes.txt' changed while the write waited for approval: "
                              "nothing was written")
    assert (ws / "notes.txt").read_text() == "their change\n"


# -- multi_edit ------------------------------------------------------------------------------------


def test_multi_edit_applies_in_order_with_one_write_and_one_change(
        app: App, ws: Path, script: Callable[..., str]) -> None:
    [result] = turn(app, script, ("multi_edit", {"path": "notes.txt", "edits": [
        {"old": "one", "new": "uno"},
        {"old": "uno\ntwo", "new": "uno\ndos"},  # sees the first edit's result
        {"old": "e", "new": "E", "replace_all": True},
    ]}))
    assert result.status == "ok", result.output
    assert result.output.startswith("edited notes.txt (3 edits, 4 replacements)\n")
    [change] = result.changes
    assert (change.op, change.added, change.removed) == ("update", 3, 3)
    assert (ws / "notes.txt").read_text() == "uno\ndos\nthrEE\n"


def test_a_failing_multi_edit_writes_nothing_and_names_the_edit(app: App, ws: Path) -> None:
    multi_edit = fn(app, "multi_edit")
    message = errors_of(lambda: multi_edit(path="notes.txt", edits=[
        {"old": "one", "new": "1"}, {"old": "one", "new": "again"}]))
    assert message == ("edit 2 of 2 failed, so nothing was written: old was not found in "
                       "notes.txt")
    message = errors_of(lambda: multi_edit(path="notes.txt", edits=[
        {"old": "one", "new": "1"}, {"old": "t", "new": "T"}]))
    assert message.startswith("edit 2 of 2 failed, so nothing was written: old matches 2 "
                              "places in notes.txt (at lines 2, 3)")
    for bad in ({"old": "one"}, "one"):
        assert "edit 1 of 1 failed, so nothing was written: expected {" in errors_of(
            lambda: multi_edit(path="notes.txt", edits=[bad]))  # noqa: B023
    assert "edits is empty" in errors_of(lambda: multi_edit(path="notes.txt", edits=[]))
    assert (ws / "notes.txt").read_text() == "one\ntwo\nthree\n"


# -- the property: an edit is str.replace, and its recorded diff reproduces the file ---------------


def _recorded(app: App, name: str, **arguments: Any) -> Any:
    """Call the tool as a turn does (inside a tool call), so its Change is recorded."""
    tool = app.agent("a").tools[name]
    inv = ToolInvocation(call=ToolCall(id="c1", name=name, arguments=arguments), tool=tool,
                         arguments=dict(arguments))
    return execute(inv)


_TEXT = st.text(alphabet=st.sampled_from(list("ab \t\n\u00e9{}")), min_size=1, max_size=80)


@settings(max_examples=80, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=_TEXT, data=st.data(), new=st.text(alphabet=st.sampled_from(list("xb \n")),
                                              max_size=12))
def test_an_edit_is_exactly_one_replacement_and_its_diff_applies_with_patch(
        app: App, ws: Path, tmp_path_factory: Any, text: str, data: Any, new: str) -> None:
    start = data.draw(st.integers(0, len(text) - 1))
    old = text[start:start + data.draw(st.integers(1, len(text) - start))]
    assume(sum(1 for i in range(len(text)) if text.startswith(old, i)) == 1 and old != new)
    (ws / "f.txt").write_bytes(text.encode())
    outcome = _recorded(app, "edit_file", path="f.txt", old=old, new=new)
    assert outcome.status == "ok", outcome.output
    after = text.replace(old, new, 1)
    assert (ws / "f.txt").read_bytes() == after.encode()
    [change] = outcome.changes
    if shutil.which("patch") is None:
        return
    folder = tmp_path_factory.mktemp("p")
    (folder / "f.txt").write_bytes(text.encode())
    done = subprocess.run(["patch", "-p1", "--binary", "-s", "-i", "-"], cwd=folder,
                          input=change.diff.encode(), capture_output=True, timeout=30)
    assert done.returncode == 0, done.stderr + done.stdout
    assert (folder / "f.txt").read_bytes() == after.encode()


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(lines=st.lists(st.text(alphabet="ab ", max_size=4), min_size=1, max_size=8),
       pick=st.integers(0, 7), new=st.text(alphabet="xy\n", max_size=6))
def test_in_a_crlf_file_an_lf_edit_keeps_every_ending_crlf(
        app: App, ws: Path, lines: list[str], pick: int, new: str) -> None:
    lines = [f"{k}:{t}" for k, t in enumerate(lines)]  # every line unique
    old = lines[pick % len(lines)] + "\n"
    (ws / "c.txt").write_bytes("".join(f"{t}\r\n" for t in lines).encode())
    fn(app, "edit_file")(path="c.txt", old=old, new=new + "\n")
    want = "".join(f"{t}\n" for t in lines).replace(old, new + "\n", 1)
    assert (ws / "c.txt").read_bytes() == want.replace("\n", "\r\n").encode()
