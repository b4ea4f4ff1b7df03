"""dsh-shell's search tools ``grep``, ``glob`` and ``list_dir``, as the installed plugin
registers them: .gitignore (nested, negation), ``.git`` skipped, binary and large files
skipped, symbolic links never followed (out of the workspace, in a loop, swapped in
mid-walk), dsh's protected paths never entered, a catastrophic regex bounded in time, huge
patterns refused, deep and wide trees bounded with a note, output sorted and cut with a note.

``rg`` is not on this machine's PATH, so dsh's own search is what most tests exercise; the
ripgrep path is checked against it where ``rg`` exists (skipped otherwise).
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from dsh.core.errors import ToolError
from dsh.ledger.events import ToolReturned
from dsh.run.app import App

dsh_shell = pytest.importorskip("dsh_shell")
from dsh_shell import search  # noqa: E402
from dsh_shell import walk  # noqa: E402

REAL_WHICH = shutil.which


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    root = tmp_path / "ws"
    root.mkdir()
    (tmp_path / "outside.txt").write_text("needle outside, keep me\n")
    return root


@pytest.fixture
def make(tmp_path: Path, ws: Path, monkeypatch: pytest.MonkeyPatch) -> Callable[..., App]:
    """``make(**shell_settings)``: agent ``a`` with the shell plugin on ``ws``. ``rg`` is
    hidden from PATH so dsh's own search runs (the rg test puts it back)."""
    monkeypatch.delenv("DSH_LOAD_PLUGINS", raising=False)
    monkeypatch.setattr(shutil, "which",
                        lambda name, *a, **k: None if name == "rg" else REAL_WHICH(name, *a, **k))

    def build(**shell: Any) -> App:
        settings = {"workspace": str(ws), "tty": str(tmp_path / "no-terminal"), **shell}
        return App.from_config({"sessions_dir": str(tmp_path / "sessions"),
                                "plugins": {"shell": settings},
                                "agents": {"a": {"plugins": ["shell"]}}})

    return build


def tools(app: App) -> tuple[Callable[..., str], Callable[..., str], Callable[..., str]]:
    t = app.agent("a").tools
    return t["grep"].fn, t["glob"].fn, t["list_dir"].fn


def files(root: Path, spec: dict[str, str | bytes]) -> None:
    for rel, content in spec.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content)


def deep_tree(root: Path, levels: int) -> None:
    """``levels`` nested folders ``d/d/…`` (made by descriptor, as a hostile tree would be),
    with ``fN.txt`` holding "needle" every 10 levels."""
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for i in range(levels):
            os.mkdir("d", dir_fd=fd)
            sub = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = sub
            if i % 10 == 0:
                f = os.open(f"f{i}.txt", os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=fd)
                os.write(f, b"needle\n")
                os.close(f)
    finally:
        os.close(fd)


# --------------------------------------------------------------------------------------------
# Registration
# --------------------------------------------------------------------------------------------


def test_registered_as_concurrent_reads_with_short_schemas(make: Callable[..., App]) -> None:
    table = make().agent("a").tools
    for name in ("grep", "glob", "list_dir"):
        t = table[name]
        assert t.plugin == "shell" and not t.sequential, name
        words = len(t.description.split()) + sum(
            len(p.get("description", "").split()) for p in t.parameters["properties"].values())
        assert words < 60, (name, words)
        assert len(t.description.split()) < 30, t.description
    assert set(table["grep"].parameters["properties"]) == {
        "pattern", "path", "glob", "ignore_case", "context", "max_results"}
    assert table["grep"].parameters["required"] == ["pattern"]


def test_reads_run_in_read_only_mode_through_the_loop(
        make: Callable[..., App], ws: Path, script: Callable[..., str]) -> None:
    files(ws, {"a.py": "needle\n"})
    app = make()
    model = script({"tool_calls": [
        {"name": "grep", "arguments": {"pattern": "needle"}},
        {"name": "glob", "arguments": {"pattern": "*.py"}},
        {"name": "list_dir", "arguments": {}},
    ]}, {"text": "ok"})
    run = app.run("go", agent="a", model=model, mode="read-only")
    got = [(e.status, e.output) for e in app.store.read(run.session_id)
           if isinstance(e, ToolReturned)]
    assert got == [("ok", "a.py:1:needle"), ("ok", "a.py"), ("ok", "./\n  a.py")]


# --------------------------------------------------------------------------------------------
# grep: output
# --------------------------------------------------------------------------------------------


def test_grep_output_is_sorted_by_path_then_line(make: Callable[..., App], ws: Path) -> None:
    files(ws, {"b.txt": "needle 1\nno\nneedle 3\n", "a/z.txt": "x needle\n",
               "a.txt": "needle\n", "A.txt": "needle\n", "a/b/c.txt": "no\n"})
    grep, _, _ = tools(make())
    assert grep(pattern="needle") == (
        "A.txt:1:needle\na.txt:1:needle\na/z.txt:1:x needle\nb.txt:1:needle 1\nb.txt:3:needle 3")
    assert grep(pattern="needle", path="a") == "a/z.txt:1:x needle"
    assert grep(pattern="needle", path="b.txt") == "b.txt:1:needle 1\nb.txt:3:needle 3"
    assert grep(pattern="needle", glob="*.txt", path="a") == "a/z.txt:1:x needle"
    assert grep(pattern="needle", glob="!b.txt") == (
        "A.txt:1:needle\na.txt:1:needle\na/z.txt:1:x needle")
    assert grep(pattern="absent") == "no matches for 'absent' in '.'"


def test_grep_ignore_case_and_context(make: Callable[..., App], ws: Path) -> None:
    files(ws, {"f.txt": "one\nNeedle\nthree\nfour\nfive\nsix\nneedle\neight\n",
               "g.txt": "NEEDLE\nafter\n"})
    grep, _, _ = tools(make())
    assert grep(pattern="needle") == "f.txt:7:needle"
    assert grep(pattern="needle", ignore_case=True, context=1) == "\n".join([
        "f.txt-1-one", "f.txt:2:Needle", "f.txt-3-three", "--",
        "f.txt-6-six", "f.txt:7:needle", "f.txt-8-eight", "--",
        "g.txt:1:NEEDLE", "g.txt-2-after"])
    # Context that touches merges into one group, as rg prints it.
    assert grep(pattern="^(three|five)$", context=1) == "\n".join([
        "f.txt-2-Needle", "f.txt:3:three", "f.txt-4-four", "f.txt:5:five", "f.txt-6-six"])
    with pytest.raises(ToolError, match="context must be 0 to 10"):
        grep(pattern="x", context=11)


def test_grep_truncation_notes(make: Callable[..., App], ws: Path) -> None:
    files(ws, {f"f{i:02}.txt": "needle\nneedle\n" for i in range(10)})
    files(ws, {"long.txt": "x" * 1000 + " needle " + "y" * 2000 + "\n"})
    grep, _, _ = tools(make())
    out = grep(pattern="needle", max_results=5, glob="f*")
    assert out.splitlines()[:5] == ["f00.txt:1:needle", "f00.txt:2:needle", "f01.txt:1:needle",
                                    "f01.txt:2:needle", "f02.txt:1:needle"]
    assert out.splitlines()[5] == ("[grep: showing 5 of 20 matching lines in 10 file(s); "
                                   "narrow the pattern, path or glob, or raise max_results]")
    line = grep(pattern="needle", path="long.txt")
    assert line.startswith("long.txt:1:[...] " + "x" * 74 + " needle ")  # 75 before the match
    assert line.endswith("y [... 1782 more characters]") and len(line) < 400
    small = tools(make(max_output=100))[0](pattern="needle", glob="f*")
    assert small.splitlines()[-1].startswith("[grep: output cut at 100 bytes: 15 more line(s) "
                                             "not shown; narrow the search")
    assert len(small.encode()) < 400
    with pytest.raises(ToolError, match="max_results must be 1 to 1000"):
        grep(pattern="x", max_results=0)


def test_huge_and_invalid_patterns_are_refused(make: Callable[..., App], ws: Path) -> None:
    grep, glob, _ = tools(make())
    with pytest.raises(ToolError, match="1001 characters long; at most 1000"):
        grep(pattern="a" * 1001)
    with pytest.raises(ToolError, match="1001 characters long; at most 1000"):
        glob(pattern="*" * 1001)
    with pytest.raises(ToolError, match="invalid regular expression '\\(unclosed'"):
        grep(pattern="(unclosed")
    with pytest.raises(ToolError, match="the pattern is empty"):
        grep(pattern="")


def test_catastrophic_regex_is_bounded_in_time(make: Callable[..., App], ws: Path) -> None:
    """``(a+)+$`` on 40 a's and a '!' backtracks 2**40 times in Python's re: the matcher is
    killed at the time bound (the shell's timeout, here 1.5 s)."""
    files(ws, {"b.txt": "a" * 40 + "!\n"})
    grep, _, _ = tools(make(timeout=1.5))
    started = time.monotonic()
    with pytest.raises(ToolError, match=r"found nothing before it was stopped after 1\.5s"
                                        r".*nested repetition such as \(a\+\)\+"):
        grep(pattern="(a+)+$")
    assert time.monotonic() - started < 5
    # What was found before the slow file comes back, with the note.
    files(ws, {"a.txt": "aaa\n"})
    started = time.monotonic()
    out = grep(pattern="(a+)+$")
    assert time.monotonic() - started < 5
    assert out.splitlines()[0] == "a.txt:1:aaa"
    assert out.splitlines()[1].startswith("[grep: stopped after 1.5s, not searched further: "
                                          "the search took too long")
    # The run goes on: the next search answers at once.
    assert grep(pattern="^aaa$") == "a.txt:1:aaa"


# --------------------------------------------------------------------------------------------
# .gitignore, .git, binary and large files
# --------------------------------------------------------------------------------------------


@pytest.fixture
def ignored(ws: Path) -> Path:
    files(ws, {
        ".gitignore": "*.log\n!keep.log\nbuild/\n/top.txt\n",
        "a.log": "needle\n", "keep.log": "needle\n", "top.txt": "needle\n",
        "build/out.txt": "needle\n", "src/build/deep.txt": "needle\n",
        "src/top.txt": "needle\n",  # /top.txt is anchored to the root
        "src/.gitignore": "secret.*\n!keep.log\n*.tmp\n",
        "src/secret.py": "needle\n", "src/sub/secret.txt": "needle\n", "src/x.tmp": "needle\n",
        "src/ok.py": "needle\n", "src/nested.log": "needle\n",
        ".git/config": "needle\n", ".git/HEAD": "needle\n", "sub/.git/x": "needle\n",
        ".git/info/exclude": "excluded.txt\n", "excluded.txt": "needle\n",
    })
    return ws


def test_gitignore_is_respected_nested_with_negation(
        make: Callable[..., App], ignored: Path) -> None:
    grep, glob, list_dir = tools(make())
    out = grep(pattern="needle").splitlines()
    assert out[:-1] == ["keep.log:1:needle", "src/ok.py:1:needle", "src/top.txt:1:needle"]
    assert out[-1] == "[grep: 9 .gitignore'd entries skipped]"
    assert glob(pattern="**/*").splitlines() == [
        ".gitignore", "keep.log", "src/.gitignore", "src/ok.py", "src/top.txt",
        "[glob: 9 .gitignore'd entries skipped]"]
    assert list_dir(depth=2) == "\n".join([
        "./", "  .git/", "  .gitignore", "  keep.log", "  src/", "    .gitignore", "    ok.py",
        "    sub/", "    top.txt", "  sub/", "    .git/",
        "[list_dir: 8 .gitignore'd entries hidden]"])  # src/sub/secret.txt is 3 levels down
    # A folder the rules ignore, named on purpose, is searched.
    assert grep(pattern="needle", path="build") == "build/out.txt:1:needle"
    # A subfolder still obeys the rules above it.
    assert grep(pattern="needle", path="src").splitlines()[:-1] == [
        "src/ok.py:1:needle", "src/top.txt:1:needle"]


def test_git_folders_are_never_searched(make: Callable[..., App], ws: Path) -> None:
    files(ws, {".git/config": "needle\n", "a/.git/x": "needle\n", "a/y.txt": "needle\n"})
    grep, glob, list_dir = tools(make())
    assert grep(pattern="needle") == "a/y.txt:1:needle"
    assert glob(pattern="**/*") == "a/y.txt"
    assert glob(pattern=".git/*") == "no files match '.git/*' in '.'"
    assert list_dir(depth=3) == "./\n  .git/\n  a/\n    .git/\n    y.txt"


def test_binary_and_large_files_are_skipped_with_a_note(
        make: Callable[..., App], ws: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    files(ws, {"bin.dat": b"needle\0\1\2", "big.txt": "needle\n" * 400, "t.txt": "needle\n"})
    monkeypatch.setattr(search, "MAX_FILE", 1000)
    grep, _, _ = tools(make())
    assert grep(pattern="needle").splitlines() == [
        "t.txt:1:needle",
        "[grep: 1 binary file(s) skipped; 1 file(s) over 1000 bytes skipped (big.txt)]"]
    # Named on its own, a binary file is still not searched.
    assert grep(pattern="needle", path="bin.dat").startswith("no matches")


# --------------------------------------------------------------------------------------------
# Symbolic links, escapes, protected paths
# --------------------------------------------------------------------------------------------


@pytest.fixture
def links(ws: Path, tmp_path: Path) -> Path:
    (tmp_path / "outdir").mkdir()
    (tmp_path / "outdir" / "secret.txt").write_text("needle in outdir\n")
    files(ws, {"real/in.txt": "needle\n"})
    (ws / "to-outside").symlink_to(tmp_path / "outside.txt")
    (ws / "outdir").symlink_to(tmp_path / "outdir")
    (ws / "loop").symlink_to(".")
    (ws / "real" / "up").symlink_to("..")
    (ws / "alias.txt").symlink_to("real/in.txt")
    return ws


def test_symlinks_are_never_followed(make: Callable[..., App], links: Path) -> None:
    grep, glob, list_dir = tools(make())
    assert grep(pattern="needle").splitlines() == [
        "real/in.txt:1:needle", "[grep: 5 symlink(s) not followed]"]
    assert glob(pattern="**/*") == "\n".join([
        "alias.txt -> (symlink)", "loop -> (symlink)", "outdir -> (symlink)",
        "real/in.txt", "real/up -> (symlink)", "to-outside -> (symlink)"])
    assert list_dir(depth=5) == "\n".join([
        "./", "  alias.txt -> (symlink)", "  loop -> (symlink)", "  outdir -> (symlink)",
        "  real/", "    in.txt", "    up -> (symlink)", "  to-outside -> (symlink)"])
    # A symlink that stays inside may name the start: the walk is of its real folder.
    assert grep(pattern="needle", path="loop/real").splitlines() == [
        "real/in.txt:1:needle", "[grep: 1 symlink(s) not followed]"]


@pytest.mark.parametrize(("path", "message"), [
    ("../", "leaves the workspace through '..'"),
    ("real/../../outside.txt", "leaves the workspace through '..'"),
    ("{tmp}/outdir", "absolute paths are refused"),
    ("outdir", "goes through a symlink that leads outside the workspace"),
    ("outdir/secret.txt", "goes through a symlink that leads outside the workspace"),
    ("to-outside", "goes through a symlink that leads outside the workspace"),
    ("missing", "no such file or folder in the workspace: 'missing'"),
])
def test_paths_out_of_the_workspace_are_refused(
        make: Callable[..., App], links: Path, tmp_path: Path, path: str, message: str) -> None:
    grep, glob, list_dir = tools(make())
    rel = path.format(tmp=tmp_path)
    for call in (lambda: grep(pattern="needle", path=rel), lambda: glob(pattern="*", path=rel),
                 lambda: list_dir(path=rel)):
        with pytest.raises(ToolError, match=message.replace("(", r"\(").replace(".", r"\.")):
            call()


def test_a_symlink_swapped_in_mid_walk_is_not_followed(
        make: Callable[..., App], ws: Path, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The listing saw a folder and a file; by the time they are opened both are symlinks
    to the outside: neither open follows them."""
    (tmp_path / "outdir").mkdir()
    (tmp_path / "outdir" / "secret.txt").write_text("needle in outdir\n")
    files(ws, {"sub/in.txt": "needle\n", "f.txt": "needle\n", "z.txt": "needle\n"})
    listed = walk.Walker._list

    def swap(self: walk.Walker, fd: int) -> list[tuple[str, str, str]]:
        items = listed(self, fd)
        if any(name == "sub" for _, name, _ in items):
            shutil.rmtree(ws / "sub")
            (ws / "sub").symlink_to(tmp_path / "outdir")
            (ws / "f.txt").unlink()
            (ws / "f.txt").symlink_to(tmp_path / "outside.txt")
        return items

    monkeypatch.setattr(walk.Walker, "_list", swap)
    grep, _, _ = tools(make())
    assert grep(pattern="needle").splitlines() == [
        "z.txt:1:needle",
        "[grep: 1 folder(s) could not be opened (sub); 1 file(s) could not be read]"]


def test_protected_paths_inside_the_workspace_are_not_entered(
        make: Callable[..., App], ws: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    files(ws, {"store/session.jsonl": "needle\n", "ok.txt": "needle\n"})
    monkeypatch.setenv("DSH_HOME", str(ws / "store"))
    grep, glob, _ = tools(make())
    assert grep(pattern="needle").splitlines() == [
        "ok.txt:1:needle", "[grep: 1 folder(s) could not be opened (store)]"]
    assert glob(pattern="**/*.jsonl").startswith("no files match")


# --------------------------------------------------------------------------------------------
# glob and list_dir
# --------------------------------------------------------------------------------------------


def test_glob_patterns(make: Callable[..., App], ws: Path) -> None:
    files(ws, {"a.py": "", "b.txt": "", "src/c.py": "", "src/d.ts": "", "src/e.tsx": "",
               "src/deep/f.py": "", ".github/w.yml": "", "sr/x.py": ""})
    _, glob, _ = tools(make())
    assert glob(pattern="*.py") == "a.py"
    assert glob(pattern="**/*.py") == "a.py\nsr/x.py\nsrc/c.py\nsrc/deep/f.py"
    assert glob(pattern="src/*.{ts,tsx}") == "src/d.ts\nsrc/e.tsx"
    assert glob(pattern="src/**") == "src/c.py\nsrc/d.ts\nsrc/deep/f.py\nsrc/e.tsx"
    assert glob(pattern="s?c/[cd].*") == "src/c.py\nsrc/d.ts"
    assert glob(pattern="**/*.yml") == ".github/w.yml"
    assert glob(pattern="*.py", path="src") == "src/c.py"
    with pytest.raises(ToolError, match="leaves its folder through '..'"):
        glob(pattern="../*")
    with pytest.raises(ToolError, match="is a file, not a folder"):
        glob(pattern="*", path="a.py")


def test_list_dir_tree_depth_and_errors(make: Callable[..., App], ws: Path) -> None:
    files(ws, {"a/b/c/d/e/f/g.txt": "", "z.txt": "", "a/y.txt": ""})
    _, _, list_dir = tools(make())
    assert list_dir() == "./\n  a/\n  z.txt"
    assert list_dir(path="a", depth=2) == "a/\n  b/\n    c/\n  y.txt"
    assert list_dir(path="a", depth=5).splitlines()[-2:] == ["          f/", "  y.txt"]
    with pytest.raises(ToolError, match="depth must be 1 to 5, not 6"):
        list_dir(depth=6)
    with pytest.raises(ToolError, match="'z.txt' is a file, not a folder"):
        list_dir(path="z.txt")
    (ws / "empty").mkdir()
    assert list_dir(path="empty") == "empty/\n  (empty)"


def test_a_deep_tree_is_bounded(make: Callable[..., App], ws: Path) -> None:
    # 300 levels, well past the bound of 64: deeper trees outgrow Python 3.11's recursive
    # shutil.rmtree, which pytest's clean-up of old temporary folders uses.
    deep_tree(ws, 300)
    grep, glob, list_dir = tools(make())
    started = time.monotonic()
    out = glob(pattern="**/*.txt").splitlines()
    assert time.monotonic() - started < 10
    assert len(out) == 8  # f0, f10, … f60: the files within 64 levels
    # Sorted as paths: "d/d/…" comes before "d/f0.txt", so the deepest file is first.
    assert out[:7] == ["d/" * (i + 1) + f"f{i}.txt" for i in range(60, -1, -10)]
    assert out[-1] == f"[glob: 1 folder(s) at {search.MAX_DEPTH} levels down were not entered]"
    found = grep(pattern="needle").splitlines()
    assert len(found) == 8 and found[-1].endswith("levels down were not entered]")
    assert list_dir(depth=5).count("d/") == 5


def test_a_wide_tree_is_bounded(make: Callable[..., App], ws: Path,
                                monkeypatch: pytest.MonkeyPatch) -> None:
    for i in range(1200):
        (ws / f"f{i:04}.txt").write_text("needle\n")
    _, glob, list_dir = tools(make(max_output=1 << 20))
    listed = glob(pattern="*.txt").splitlines()
    assert listed[:2] == ["f0000.txt", "f0001.txt"] and listed[499] == "f0499.txt"
    assert listed[500:] == ["[glob: showing 500 of 1200 matches; narrow the pattern or the "
                            "path]"]
    tree = list_dir().splitlines()
    assert len(tree) == 502 and tree[-1].startswith("[list_dir: showing 500 of 1200 entries")
    monkeypatch.setattr(search, "MAX_COUNTED", 700)
    assert glob(pattern="*.txt").splitlines()[-1] == (
        "[glob: showing 500 of at least 700 matches; narrow the pattern or the path]")
    assert list_dir().splitlines()[-1].startswith("[list_dir: showing 500 of at least 700 ")
    # The bound on entries listed stops the walk; the count is then a floor.
    monkeypatch.setattr(search, "MAX_ENTRIES", 600)
    cut = glob(pattern="**/*").splitlines()[-1]
    assert cut == ("[glob: showing 500 of at least 600 matches; narrow the pattern or the path; "
                   "stopped listing after 600 entries: later entries not seen]")


def test_no_descriptor_is_left_open(make: Callable[..., App], links: Path) -> None:
    files(links, {"zz.txt": "a" * 40 + "!\n", "real/sub/x.txt": "needle\n"})
    grep, glob, list_dir = tools(make(timeout=1))
    before = sorted(os.listdir("/proc/self/fd"))
    assert grep(pattern="needle").startswith("real/in.txt:1:needle\nreal/sub/x.txt:1:needle")
    assert "real/sub/x.txt" in glob(pattern="**/*")
    assert "      x.txt" in list_dir(depth=5)
    with pytest.raises(ToolError, match="stopped after 1s"):
        grep(pattern="(a+)+$", path="zz.txt")
    assert sorted(os.listdir("/proc/self/fd")) == before


# --------------------------------------------------------------------------------------------
# ripgrep, where it is installed
# --------------------------------------------------------------------------------------------


@pytest.mark.skipif(REAL_WHICH("rg") is None, reason="rg is not on PATH")
def test_ripgrep_gives_the_same_answers(make: Callable[..., App], ignored: Path,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    files(ignored, {"f.txt": "one\nNeedle\nthree\n", "bin.dat": b"needle\0"})
    queries: list[dict[str, Any]] = [
        {"pattern": "needle"}, {"pattern": "NEEDLE", "ignore_case": True, "context": 1},
        {"pattern": "needle", "glob": "*.py"}, {"pattern": "needle", "path": "src"},
        {"pattern": "needle", "path": "build"}, {"pattern": "needle", "glob": "!*.py"},
        {"pattern": "needle", "max_results": 2}]
    grep = tools(make())[0]
    own = [grep(**q).splitlines() for q in queries]
    monkeypatch.setattr(shutil, "which", REAL_WHICH)  # the same app's grep now finds rg
    theirs = [grep(**q).splitlines() for q in queries]
    # rg does not count what it skipped: the results are compared, and the cut's note.
    def results(lines: list[str]) -> list[str]:
        return [line for line in lines if not line.startswith("[grep: ")]

    assert [results(o) for o in own] == [results(t) for t in theirs]
    assert theirs[-1][-1].startswith("[grep: showing 2 of 3 matching lines in 3 file(s)")
    assert own[-1][-1].startswith("[grep: showing 2 of 3 matching lines in 3 file(s)")
    with pytest.raises(ToolError, match="regex parse error"):
        grep(pattern="(unclosed")
