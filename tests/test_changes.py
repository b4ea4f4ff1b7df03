"""Every change a tool makes is a diff in the ledger: recorded on ``tool/result``, loaded back
exactly, exact enough for ``patch`` to reproduce the file, and shown by ``sessions show``, the
Markdown and HTML exports and ``dsh chat`` from the ledger, never from the disk."""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st

from dsh.core.messages import Change
from dsh.ledger.events import ToolReturned
from dsh.ledger.serialize import check_raw
from dsh.ledger.serialize import dump_event
from dsh.ledger.serialize import load_event
from dsh.run.app import App
from dsh.tools import changes


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    root = tmp_path / "ws"
    root.mkdir()
    (root / "notes.txt").write_text("one\ntwo\nthree\n")
    return root


@pytest.fixture
def app(tmp_path: Path, ws: Path) -> App:
    return App.from_config({
        "sessions_dir": str(tmp_path / "sessions"),
        "plugins": {"shell": {"workspace": str(ws), "tty": str(tmp_path / "no-tty")}},
        "agents": {"a": {"plugins": ["shell"], "tools": ["write_file", "read_file"]}},
    })


def _results(app: App, session: str) -> list[ToolReturned]:
    return [e for e in app.store.read(session) if isinstance(e, ToolReturned)]


def test_a_write_records_its_diff_with_the_result(app: App, ws: Path,
                                                  script: Callable[..., str]) -> None:
    model = script({"tool_calls": [
        {"name": "write_file", "arguments": {"path": "notes.txt", "content": "one\n2\nthree\n"}},
        {"name": "write_file", "arguments": {"path": "new/made.txt", "content": "hi"}},
    ]}, {"text": "done"})
    run = app.run("edit", agent="a", model=model, approve=True)
    first, second = _results(app, run.session_id)
    (update,) = first.changes
    assert (update.op, update.path, update.added, update.removed) == ("update", "notes.txt", 1, 1)
    assert update.diff == ("--- a/notes.txt\n+++ b/notes.txt\n@@ -1,3 +1,3 @@\n one\n-two\n+2\n"
                           " three\n")
    assert update.before_sha256 != update.after_sha256 and update.complete
    assert "-two\n+2" in first.output  # the model reads the diff of its write
    (add,) = second.changes
    assert (add.op, add.path, add.before_sha256) == ("add", "new/made.txt", None)
    assert add.diff.endswith("+hi\n\\ No newline at end of file\n")
    # a refused write records no change
    refused = app.run("again", agent="a", model=script({"tool_calls": [
        {"name": "write_file", "arguments": {"path": "notes.txt", "content": "x"}}]},
        {"text": "ok"}))
    (r,) = _results(app, refused.session_id)
    assert r.status == "error" and r.changes == () and (ws / "notes.txt").read_text() == \
        "one\n2\nthree\n"


def test_changes_round_trip_and_lines_without_them_stay_as_they_were() -> None:
    c = Change(path="a.py", op="move", diff="--- a/a.py\n+++ b/b.py\n", added=0, removed=0,
               moved_to="b.py", before_sha256="0" * 64, after_sha256="1" * 64, complete=False)
    e = ToolReturned(seq=3, ts="t", session="s", call_id="c1", name="apply_patch",
                     output="R a.py -> b.py", changes=(c,))
    line = dump_event(e)
    assert load_event(line).changes == (c,)
    check_raw(json.loads(line))
    plain = dump_event(ToolReturned(seq=4, ts="t", session="s", call_id="c2", name="x"))
    assert "changes" not in plain  # the line a read writes is the line it always wrote


@pytest.mark.parametrize("bad", [
    [{"path": "a", "op": "chmod", "diff": ""}],
    [{"path": 3, "op": "update"}],
    [{"path": "a", "op": "update", "added": "1"}],
    [{"path": "a", "op": "update", "complete": "no"}],
    "not a list",
    [["path", "a"]],
])
def test_a_hostile_changes_field_is_refused_on_both_load_paths(bad: Any) -> None:
    d = {"v": 1, "type": "tool/result", "seq": 1, "ts": "t", "session": "s", "call_id": "c",
         "name": "x", "changes": bad}
    with pytest.raises(Exception) as raw:
        check_raw(d)
    with pytest.raises(Exception) as full:
        load_event(json.dumps(d))
    assert raw.type.__name__ in ("_Invalid", "InvalidLine", "LedgerError", "KeyError",
                                 "TypeError")
    assert full.value is not None


_TEXT = st.text(alphabet=st.sampled_from(list("ab \t\r\n\u00e9\u2028\x0c")), max_size=60)


@settings(max_examples=60, deadline=None)
@given(before=_TEXT, after=_TEXT)
def test_the_recorded_diff_reproduces_the_file_with_patch(tmp_path_factory: Any, before: str,
                                                          after: str) -> None:
    if shutil.which("patch") is None:
        pytest.skip("the patch program is not installed")
    if before == after:
        return
    folder = tmp_path_factory.mktemp("p")
    target = folder / "f.txt"
    target.write_bytes(before.encode())
    change = changes.record("f.txt", before.encode(), after.encode())
    assert change.complete
    done = subprocess.run(["patch", "-p1", "--binary", "-s", "-i", "-"], cwd=folder,
                          input=change.diff.encode(), capture_output=True, timeout=30)
    assert done.returncode == 0, done.stderr + done.stdout
    assert target.read_bytes() == after.encode()


def test_binary_and_oversized_changes_are_recorded_incomplete() -> None:
    b = changes.record("img.png", b"\x89PNG\0\0", b"\x89PNG\0\1")
    assert not b.complete and "Binary files differ" in b.diff and b.op == "update"
    big = changes.record("big.txt", b"", b"x\n" * (changes.MAX_RECORDED // 2 + 10))
    assert not big.complete and len(big.diff) <= changes.MAX_RECORDED
    assert big.added == changes.MAX_RECORDED // 2 + 10  # the counts stay exact
    shown = changes.for_model([big], max_lines=5)
    assert shown.count("\n") == 5 and "more lines not shown" in shown


def _session_with_a_change(app: App, script: Callable[..., str], text: str) -> str:
    model = script({"tool_calls": [{"name": "write_file", "arguments": {
        "path": "notes.txt", "content": text}}]}, {"text": "done"})
    return app.run("edit", agent="a", model=model, approve=True).session_id


def test_views_render_the_recorded_diff_not_the_disk(app: App, ws: Path, tmp_path: Path,
                                                     script: Callable[..., str]) -> None:
    from dsh.cli.export_html import render
    from dsh.cli.render import markdown
    from dsh.cli.render import trajectory

    sid = _session_with_a_change(app, script, "one\n\x1b[31mTWO\nthree\n")
    (ws / "notes.txt").write_text("changed on disk since\n")  # the views never read this
    events = list(app.store.read(sid))
    shown = trajectory(events, color=True, terminal=True)
    assert "± update notes.txt (+1 -1)" in shown
    assert "\x1b[31mTWO" not in shown  # the file's escape sequence never drives a terminal
    assert "\x1b[32m" in shown  # added lines green
    assert "changed on disk" not in shown
    md = markdown(sid, events)
    assert "```diff\n--- a/notes.txt\n+++ b/notes.txt" in md
    html = render(sid, events)
    assert '<span class="add">+\ufffd[31mTWO</span>' in html and "changed on disk" not in html
    assert "update notes.txt (+1 -1)" in html


@settings(max_examples=200, deadline=None)
@given(before=_TEXT, after=_TEXT)
def test_a_recorded_diff_applies_and_undoes_exactly(before: str, after: str) -> None:
    change = changes.record("f.txt", before.encode(), after.encode())
    assert changes.apply_diff(change.diff, before) == after
    assert changes.apply_diff(change.diff, after, reverse=True) == before
    assert changes.undo(change, after.encode()) == before.encode()


def test_undo_refuses_a_file_changed_since_and_an_incomplete_diff() -> None:
    change = changes.record("f.txt", b"a\nb\n", b"a\nc\n")
    with pytest.raises(changes.DiffMismatch, match="changed since"):
        changes.undo(change, b"a\nc\nmore\n")
    with pytest.raises(changes.DiffMismatch, match="changed since"):
        changes.undo(change, None)
    with pytest.raises(changes.DiffMismatch, match="line 2 is not what the diff expects"):
        changes.apply_diff(change.diff, "a\nX\n")
    binary = changes.record("b.bin", b"\0", b"\0\1")
    with pytest.raises(changes.DiffMismatch, match="without its whole diff"):
        changes.undo(binary, b"\0\1")
    added = changes.record("new.txt", None, b"x\n")
    assert changes.undo(added, b"x\n") is None  # undoing an add removes the file
    deleted = changes.record("old.txt", b"x\ny\n", None)
    assert changes.undo(deleted, None) == b"x\ny\n"


def test_a_plugin_cannot_make_the_ledger_unreadable_through_changes(
        tmp_path: Path, script: Callable[..., str], plugin_module: Any) -> None:
    """Whatever a tool appends to its call's changes, only values the ledger reads back are
    written: the session still loads and resumes."""
    from dsh.hookspecs import hookimpl
    from dsh.tools.registry import current_call

    @hookimpl
    def register_tools(register: Any) -> None:
        def meddle() -> str:
            """Append junk to the call's changes."""
            call = current_call()
            call.changes.append("not a change")  # type: ignore[arg-type]
            call.changes.append(Change(path="a", op="update", added="1"))  # type: ignore[arg-type]
            call.changes.append(Change(path="\udcff", op="update"))
            call.changes.append(Change(path="a", op="chmod"))
            changes.record("ok.txt", b"a\n", b"b\n")  # appends itself
            return "done"

        register(meddle)

    name = plugin_module(register_tools=register_tools)
    app = App.from_config({"sessions_dir": str(tmp_path / "s"), "autoload": False,
                           "load": [name]})
    run = app.run("go", model=script({"tool_calls": [{"name": "meddle", "arguments": {}}]},
                                     {"text": "ok"}))
    assert run.outcome == "completed", run.reason
    [result] = _results(app, run.session_id)
    assert [c.path for c in result.changes] == ["ok.txt"]
    # both load paths accept every line written (resume reads the raw one)
    for line in Path(run.path).read_text().splitlines():
        check_raw(json.loads(line))
        load_event(line)
