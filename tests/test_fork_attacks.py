"""``dsh sessions fork`` / ``rewind --files`` attacked: the ledger is untrusted input.

Every test runs real ``dsh`` subprocesses on ledgers written here line by line — the change
records a hostile plugin, a hand-edited or a foreign session file could hold: paths that
leave the workspace or go through links, records whose op, digests and diff disagree,
sub-agent names that loop, and lines dsh does not know. Each checks that nothing outside what
the records may touch changed, and that a refused rewind made no fork."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parent.parent
SID = "20261203-000000.000-aaaaaa"
KID = "20261203-000000.000-bbbbbb"
TS = "2026-12-03T00:00:00.000Z"


def _env() -> dict[str, str]:
    e = {k: v for k, v in os.environ.items()
         if k not in ("NO_COLOR", "DSH_LOAD_PLUGINS", "DSH_CONFIG")}
    e.update(OPENAI_API_KEY="sk-test-fork", PYTHONPATH=str(REPO))
    return e


def _dsh(cfg: Path, *args: str, cwd: Path | None = None, timeout: float = 120
         ) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "dsh", "--config", str(cfg), *args],
                          capture_output=True, text=True, env=_env(), timeout=timeout,
                          stdin=subprocess.DEVNULL, cwd=cwd, start_new_session=True)


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().split("\n") if line]


def _config(tmp: Path, sessions: Path | None = None) -> Path:
    cfg = tmp / "echo.toml"
    cfg.write_text(f'autoload = false\nmodel = "echo"\n'
                   f'sessions_dir = "{sessions or tmp / "sessions"}"\n')
    return cfg


Call = list[dict[str, Any]] | tuple[str, list[dict[str, Any]]]  # changes, or (child, changes)


def _ledger(sessions: Path, sid: str, turns: list[tuple[str | None, list[Call]]],
            dangling: str | None = None) -> Path:
    """A session file: each turn ``(cwd, calls)`` (cwd None: unchanged), each call a
    ``tool/call`` + ``tool/result`` with those changes, or ``(child, changes)`` for a
    sub-agent call naming that child session. ``dangling``: one last sub-agent call that
    never returned (a crash)."""
    sessions.mkdir(parents=True, exist_ok=True)
    lines: list[dict[str, Any]] = []

    def add(**d: Any) -> None:
        lines.append({"v": 1, "seq": len(lines), "ts": TS, "session": sid, **d})

    for n, (cwd, calls) in enumerate(turns, 1):
        start: dict[str, Any] = {"turn": n, "agent": "default"}
        if cwd is not None:
            start["cwd"] = str(cwd)
        add(type="turn/start", **start)
        add(type="user/message", text=f"message {n}")
        for k, call in enumerate(calls):
            child, changes = call if isinstance(call, tuple) else (None, call)
            cid = f"call_{n}_{k}"
            add(type="tool/call", call_id=cid, name="write_file", arguments={},
                child_session=child)
            add(type="tool/result", call_id=cid, name="write_file", status="ok",
                output="done", changes=changes)
        if dangling is not None and n == len(turns):
            add(type="tool/call", call_id="call_dangling", name="ask_helper", arguments={},
                child_session=dangling)
            break  # the process died here
        add(type="turn/end", turn=n, outcome="completed", reason="")
    path = sessions / f"{sid}.jsonl"
    path.write_text("".join(json.dumps(d, separators=(",", ":")) + "\n" for d in lines))
    return path


def _add(path: str, data: bytes) -> dict[str, Any]:
    """What write_file records creating ``path`` with the text ``data``."""
    rows = "".join(f"+{line}\n" for line in data.decode().splitlines())
    count = len(data.decode().splitlines())
    return {"path": path, "op": "add", "after_sha256": sha(data),
            "diff": f"--- /dev/null\n+++ b/{path}\n@@ -0,0 +1,{count} @@\n{rows}"}


def _delete(path: str, data: bytes) -> dict[str, Any]:
    """What a tool records deleting ``path`` that held the text ``data`` (rewind recreates)."""
    rows = "".join(f"-{line}\n" for line in data.decode().splitlines())
    count = len(data.decode().splitlines())
    return {"path": path, "op": "delete", "before_sha256": sha(data),
            "diff": f"--- a/{path}\n+++ /dev/null\n@@ -1,{count} +0,0 @@\n{rows}"}


def _update(path: str, old: bytes, new: bytes) -> dict[str, Any]:
    """A one-line file changed from ``old`` to ``new``."""
    return {"path": path, "op": "update", "before_sha256": sha(old), "after_sha256": sha(new),
            "diff": f"--- a/{path}\n+++ b/{path}\n@@ -1 +1 @@\n-{old.decode()}+{new.decode()}"}


def _tree(top: Path) -> dict[str, bytes | str]:
    """Every entry under ``top`` (links by target, files by content), to compare."""
    out: dict[str, bytes | str] = {}
    for dirpath, dirs, files in os.walk(top):
        for name in dirs + files:
            p = Path(dirpath) / name
            rel = str(p.relative_to(top))
            if p.is_symlink():
                out[rel] = "-> " + os.readlink(p)
            elif p.is_file():
                out[rel] = p.read_bytes()
            else:
                out[rel] = "dir"
    return out


class World:
    """A workspace ``ws`` inside ``tmp``, a sibling ``outside`` folder with a secret, the
    sessions folder, and a way to check that a refused rewind changed nothing at all."""

    def __init__(self, tmp: Path, sessions: Path | None = None) -> None:
        self.tmp = tmp
        self.ws = tmp / "ws"
        self.ws.mkdir()
        self.outside = tmp / "outside"
        self.outside.mkdir()
        (self.outside / "secret.txt").write_bytes(b"secret\n")
        self.sessions = sessions or tmp / "sessions"
        self.cfg = _config(tmp, self.sessions)

    def snapshot(self) -> dict[str, bytes | str]:
        return {k: v for k, v in _tree(self.tmp).items()
                if not k.startswith(str(self.sessions.relative_to(self.tmp)) + "/.index")}

    def rewind(self, *extra: str, sid: str = SID, to: int = 1, timeout: float = 120
               ) -> subprocess.CompletedProcess[str]:
        return _dsh(self.cfg, "sessions", "rewind", sid, "--to", str(to), "--files", *extra,
                    cwd=self.ws, timeout=timeout)

    def refused(self, *needles: str, sid: str = SID, to: int = 1) -> str:
        """Rewind, expecting exit 2, naming ``needles``, with nothing written anywhere."""
        before = self.snapshot()
        done = self.rewind(sid=sid, to=to)
        assert done.returncode == 2, (done.returncode, done.stdout, done.stderr)
        assert "Traceback" not in done.stderr, done.stderr
        for needle in needles:
            assert needle in done.stderr, done.stderr
        assert not done.stdout
        assert self.snapshot() == before  # no file, no fork, no .tmp
        return done.stderr


@pytest.fixture
def world(tmp_path: Path) -> World:
    return World(tmp_path)


# -- change records that name places they must not --------------------------------------------


@pytest.mark.parametrize("path, why", [
    ("/etc/dsh-rewind-attack", "absolute path"),
    ("../outside/secret.txt", "'..'"),
    ("a/../../outside/secret.txt", "'..'"),
    ("a\x00b", "NUL"),
    ("", "the folder itself"),
    (".", "the folder itself"),
])
def test_a_record_naming_a_path_outside_the_workspace_is_refused(
        world: World, path: str, why: str) -> None:
    _ledger(world.sessions, SID, [(str(world.ws), []), (None, [[_delete(path, b"pwned\n")]])])
    world.refused("cannot rewind", why, "nothing was restored")
    assert not Path("/etc/dsh-rewind-attack").exists()


def test_a_symlink_planted_where_a_file_is_restored_is_not_followed(world: World) -> None:
    (world.ws / "notes.txt").symlink_to(world.outside / "secret.txt")
    (world.ws / "linkdir").symlink_to(world.outside)
    (world.ws / "dangling").symlink_to(world.outside / "new.txt")
    # an update whose after digest is the secret's: through the link it would "match"
    _ledger(world.sessions, SID, [(str(world.ws), []), (None, [
        [_update("notes.txt", b"mine\n", b"secret\n")]])])
    world.refused("cannot rewind notes.txt", "symbolic link")
    for path in ("linkdir/secret.txt", "linkdir/new.txt", "dangling"):
        data = b"secret\n" if path.endswith("secret.txt") else b"pwned\n"
        record = (_update(path, b"x\n", data) if path.endswith("secret.txt")
                  else _delete(path, data))
        _ledger(world.sessions, SID, [(str(world.ws), []), (None, [[record]])])
        world.refused("cannot rewind", "symbolic link")
    assert (world.outside / "secret.txt").read_bytes() == b"secret\n"
    assert not (world.outside / "new.txt").exists()


def test_an_added_file_replaced_by_a_link_to_the_same_content_is_kept(world: World) -> None:
    """The tool made notes.txt; the person replaced it with a symlink to their own copy
    (same bytes): rewind must not remove the link nor the file it names."""
    data = b"the same\n"
    (world.outside / "mine.txt").write_bytes(data)
    (world.ws / "notes.txt").symlink_to(world.outside / "mine.txt")
    _ledger(world.sessions, SID, [(str(world.ws), []), (None, [[_add("notes.txt", data)]])])
    world.refused("cannot rewind notes.txt", "symbolic link")
    assert (world.outside / "mine.txt").read_bytes() == data


@pytest.mark.parametrize("path", [".git/config", ".git/hooks/pre-commit", ".GIT/config",
                                  ".mcp.json", "AGENTS.md", "CLAUDE.md", ".dsh/config.toml",
                                  ".claude/settings.json", ".git./config"])
def test_a_record_never_writes_a_persistence_path(world: World, path: str) -> None:
    """git runs .git/config's core.fsmonitor unconfined; dsh-shell's write_file refuses these,
    so a rewind "recreating" one is no way around that."""
    payload = b"[core]\n\tfsmonitor = touch /tmp/pwned\n"
    _ledger(world.sessions, SID, [(str(world.ws), []), (None, [[_delete(path, payload)]])])
    world.refused("cannot rewind", "shapes later runs")


def test_a_record_never_touches_the_sessions_folder_inside_the_workspace(tmp_path: Path
                                                                         ) -> None:
    w = World(tmp_path, sessions=tmp_path / "ws" / "sessions")
    other = "20261203-000000.000-cccccc"
    victim = _ledger(w.sessions, other, [(str(w.ws), [])])
    kept = victim.read_bytes()
    _ledger(w.sessions, SID, [(str(w.ws), []), (None, [[_add(f"sessions/{other}.jsonl",
                                                              kept)]])])
    w.refused("sessions folder")
    assert victim.read_bytes() == kept
    # by its other spellings too
    for spelled in (f"./sessions//{other}.jsonl", f"sessions/./{other}.jsonl"):
        _ledger(w.sessions, SID, [(str(w.ws), []), (None, [[_add(spelled, kept)]])])
        w.refused("sessions folder")
    assert victim.read_bytes() == kept


def test_a_protected_data_dir_in_the_workspace_is_refused(tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch
                                                          ) -> None:
    w = World(tmp_path)
    monkeypatch.setenv("DSH_HOME", str(w.ws / "data"))
    (w.ws / "data").mkdir()
    _ledger(w.sessions, SID, [(str(w.ws), []), (None, [[_delete("data/keys", b"k\n")]])])
    w.refused("cannot rewind data/keys", "protected")


@pytest.mark.parametrize("path", ["d" * 300, "/".join(["d"] * 3000) + "/f",
                                  "x" * 250 + "/" + "y" * 250])
def test_very_long_paths_are_refused_or_restored_but_never_crash(world: World,
                                                                 path: str) -> None:
    _ledger(world.sessions, SID, [(str(world.ws), []), (None, [[_delete(path, b"z\n")]])])
    done = world.rewind()
    assert "Traceback" not in done.stderr, done.stderr
    if done.returncode == 0:
        assert (world.ws / path).read_bytes() == b"z\n"
    else:
        assert done.returncode == 2 and "cannot rewind" in done.stderr
        assert list(world.ws.iterdir()) == []


def test_a_lone_surrogate_in_a_path_is_a_clean_refusal(world: World) -> None:
    path = _ledger(world.sessions, SID, [(str(world.ws), []),
                                         (None, [[_delete("PLACEHOLDER", b"z\n")]])])
    path.write_text(path.read_text().replace("PLACEHOLDER", "caf\\udce9"))
    before = world.snapshot()
    done = world.rewind()
    assert done.returncode != 0 and "Traceback" not in done.stderr, done.stderr
    assert "surrogate" in done.stderr
    assert world.snapshot() == before


# -- records that lie -------------------------------------------------------------------------


def test_an_add_whose_digest_names_a_users_file_but_whose_diff_does_not_is_refused(
        world: World) -> None:
    """Found: a record ``{"op": "add", "after_sha256": sha(user's file), "diff": ""}`` made
    rewind delete the person's file (undo of an add never looked at the diff)."""
    (world.ws / "user.txt").write_bytes(b"precious\n")
    record = {"path": "user.txt", "op": "add", "diff": "", "after_sha256": sha(b"precious\n")}
    _ledger(world.sessions, SID, [(str(world.ws), []), (None, [[record]])])
    world.refused("cannot rewind user.txt", "does not hold together")
    assert (world.ws / "user.txt").read_bytes() == b"precious\n"


@pytest.mark.parametrize("record", [
    # an "add" of a file that existed before: undoing it must not delete it
    {"op": "add", "before_sha256": sha(b"older\n"), "after_sha256": sha(b"precious\n")},
    # a "delete" that says the file is still there
    {"op": "delete", "before_sha256": sha(b"x\n"), "after_sha256": sha(b"precious\n")},
    # an "update" of a file that did not exist
    {"op": "update", "before_sha256": None, "after_sha256": sha(b"precious\n")},
    # a move without its new name, and onto itself
    {"op": "move", "before_sha256": sha(b"x\n"), "after_sha256": sha(b"precious\n")},
    {"op": "move", "moved_to": "./user.txt", "before_sha256": sha(b"x\n"),
     "after_sha256": sha(b"precious\n")},
    # an update that names a new path
    {"op": "update", "moved_to": "other.txt", "before_sha256": sha(b"x\n"),
     "after_sha256": sha(b"precious\n")},
])
def test_a_record_whose_op_contradicts_its_digests_is_refused(world: World,
                                                               record: dict[str, Any]) -> None:
    (world.ws / "user.txt").write_bytes(b"precious\n")
    _ledger(world.sessions, SID, [(str(world.ws), []), (None, [[
        {"path": "user.txt", "diff": "--- a/user.txt\n+++ b/user.txt\n@@ -1 +1 @@\n-x\n"
                                     "+precious\n", **record}]])])
    world.refused("cannot rewind", "nothing was restored")
    assert (world.ws / "user.txt").read_bytes() == b"precious\n"


@pytest.mark.parametrize("diff", [
    "--- a/f\n+++ b/f\n@@ -1 +1 @@\n-something else\n+now\n",  # does not apply
    "--- a/f\n+++ b/f\n@@ -1 +1 @@\n-other\n+now\n",  # applies, wrong before digest
    "@@ -99999999999999999999 +1 @@\n-x\n+now\n",  # absurd hunk
    "not a diff at all",
])
def test_a_diff_that_does_not_give_the_recorded_before_is_refused(world: World,
                                                                  diff: str) -> None:
    (world.ws / "f").write_bytes(b"now\n")
    record = {"path": "f", "op": "update", "diff": diff, "before_sha256": sha(b"then\n"),
              "after_sha256": sha(b"now\n")}
    _ledger(world.sessions, SID, [(str(world.ws), []), (None, [[record]])])
    world.refused("cannot rewind f")
    assert (world.ws / "f").read_bytes() == b"now\n"


def test_a_file_that_is_not_utf8_is_refused_not_a_traceback(world: World) -> None:
    """Found: a complete record over a Latin-1 file made ``undo`` raise UnicodeDecodeError
    (exit 1 with a traceback)."""
    data = b"caf\xe9\n"
    (world.ws / "latin.txt").write_bytes(data)
    for record in ({"path": "latin.txt", "op": "update", "diff": "@@ -1 +1 @@\n-a\n+b\n",
                    "before_sha256": sha(b"a\n"), "after_sha256": sha(data)},
                   {"path": "latin.txt", "op": "add", "diff": "", "after_sha256": sha(data)}):
        _ledger(world.sessions, SID, [(str(world.ws), []), (None, [[record]])])
        world.refused("cannot rewind latin.txt")
    assert (world.ws / "latin.txt").read_bytes() == data


def test_two_changes_to_one_path_in_one_call_are_undone_in_order(world: World) -> None:
    (world.ws / "f").write_bytes(b"three\n")
    chain = [_update("f", b"one\n", b"two\n"), _update("./f", b"two\n", b"three\n")]
    _ledger(world.sessions, SID, [(str(world.ws), []), (None, [chain[::-1]])])
    world.refused("cannot rewind f")  # out of order: the first undone does not fit
    _ledger(world.sessions, SID, [(str(world.ws), []), (None, [chain])])
    done = world.rewind()
    assert done.returncode == 0, done.stderr
    assert (world.ws / "f").read_bytes() == b"one\n"  # two spellings, one file
    assert done.stderr.count("restored: f") == 1


def test_a_move_back_onto_a_file_that_exists_again_is_refused(world: World) -> None:
    (world.ws / "new.txt").write_bytes(b"moved\n")
    (world.ws / "old.txt").write_bytes(b"the person's new old.txt\n")
    record = {"path": "old.txt", "op": "move", "moved_to": "new.txt",
              "diff": "--- a/old.txt\n+++ b/new.txt\n@@ -1 +1 @@\n-orig\n+moved\n",
              "before_sha256": sha(b"orig\n"), "after_sha256": sha(b"moved\n")}
    _ledger(world.sessions, SID, [(str(world.ws), []), (None, [[record]])])
    world.refused("cannot rewind old.txt", "exists again")


def test_a_file_and_a_folder_of_one_name_refuse_before_anything_is_written(world: World
                                                                           ) -> None:
    """Found: two delete records, ``d`` and ``d/x``, both passed the check; the write of one
    then failed and left the other restored, and the fork made."""
    _ledger(world.sessions, SID, [(str(world.ws), []), (None, [
        [_delete("a.txt", b"a\n")], [_delete("d", b"file\n")], [_delete("d/x", b"x\n")]])])
    world.refused("cannot rewind", "both as a file and as a folder")
    assert list(world.ws.iterdir()) == []


def test_a_write_that_fails_half_way_puts_back_what_it_wrote_and_makes_no_fork(
        world: World) -> None:
    """The first file is restored, the second cannot be written (procfs takes no new file):
    the first is removed again and the fork deleted, as the message says."""
    _ledger(world.sessions, SID, [(str(world.ws), []),
                                  ("/proc", [[_delete("dsh-rewind-attack", b"p\n")]]),
                                  (str(world.ws), [[_delete("a.txt", b"a\n")]])])
    (world.ws / "keep.txt").write_bytes(b"keep\n")
    world.refused("cannot restore dsh-rewind-attack", "nothing was restored")
    assert not (world.ws / "a.txt").exists()


# -- where the files are: the working directory of each turn ---------------------------------


def test_each_change_is_undone_in_the_directory_its_turn_ran_in(tmp_path: Path) -> None:
    """Found: rewind put files back beneath the session's *first* recorded working directory,
    though a later turn (resumed in another checkout) made them elsewhere: a deletion was
    recreated in the wrong tree, and an add whose content matched a file there deleted it."""
    w = World(tmp_path)
    other = tmp_path / "other"
    other.mkdir()
    (w.ws / "same.txt").write_bytes(b"same\n")  # the first checkout's own file
    (other / "same.txt").write_bytes(b"same\n")  # made by the tool, in the second
    _ledger(w.sessions, SID, [(str(w.ws), []),
                              (str(other), [[_add("same.txt", b"same\n")],
                                            [_delete("gone.txt", b"gone\n")]]),
                              (str(w.ws), [[_delete("back.txt", b"back\n")]])])
    done = w.rewind()
    assert done.returncode == 0, done.stderr
    assert (w.ws / "same.txt").read_bytes() == b"same\n"
    assert not (w.ws / "gone.txt").exists()
    assert not (other / "same.txt").exists()
    assert (other / "gone.txt").read_bytes() == b"gone\n"
    assert (w.ws / "back.txt").read_bytes() == b"back\n"
    assert "recreated: back.txt\n" in done.stderr  # where the session last ran: relative
    assert f"recreated: {other / 'gone.txt'}" in done.stderr  # another folder: named whole


# -- sub-agents -------------------------------------------------------------------------------


def test_a_cycle_of_sub_agent_sessions_is_refused_at_once(world: World) -> None:
    """Found: a child session naming itself six times made the walk read it 6**8 times (the
    rewind ran for hours)."""
    _ledger(world.sessions, SID, [(str(world.ws), []),
                                  (None, [(KID, [])] * 6)])
    _ledger(world.sessions, KID, [(str(world.ws), [(KID, [])] * 6)])
    t = time.monotonic()
    world.refused(KID, "more than once")
    assert time.monotonic() - t < 60
    # the session naming itself as its own sub-agent
    _ledger(world.sessions, SID, [(str(world.ws), []), (None, [(SID, [])])])
    world.refused(SID, "more than once")


@pytest.mark.parametrize("child", ["../outside/x", "latest", KID[:8], "20261203-nothere",
                                   "/etc/passwd", ".hidden"])
def test_a_missing_or_path_like_child_refuses_the_rewind(world: World, child: str) -> None:
    (world.ws / "f").write_bytes(b"two\n")
    _ledger(world.sessions, SID, [(str(world.ws), []),
                                  (None, [[_update("f", b"one\n", b"two\n")], (child, [])])])
    _ledger(world.sessions, KID, [(str(world.ws), [])])
    world.refused("sub-agent session", "nothing was restored")
    assert (world.ws / "f").read_bytes() == b"two\n"


def test_sub_agents_nested_deeper_than_followed_refuse_rather_than_skip(world: World) -> None:
    ids = [f"20261203-000000.000-{i:06x}" for i in range(1, 11)]
    _ledger(world.sessions, SID, [(str(world.ws), []), (None, [(ids[0], [])])])
    for mine, nxt in zip(ids, ids[1:]):
        _ledger(world.sessions, mine, [(str(world.ws), [(nxt, [])])])
    _ledger(world.sessions, ids[-1], [(str(world.ws), [[_add("deep.txt", b"deep\n")]])])
    (world.ws / "deep.txt").write_bytes(b"deep\n")
    world.refused("too deep")
    assert (world.ws / "deep.txt").exists()


def test_a_sub_agent_call_that_never_returned_still_has_its_files_undone(world: World
                                                                          ) -> None:
    """Found: a run killed during a sub-agent call has no ``tool/result`` for it, and rewind
    silently left everything the child wrote in place."""
    _ledger(world.sessions, SID, [(str(world.ws), []), (None, [])], dangling=KID)
    _ledger(world.sessions, KID, [(str(world.ws), [[_add("child.txt", b"child\n")]])])
    (world.ws / "child.txt").write_bytes(b"child\n")
    done = world.rewind()
    assert done.returncode == 0, done.stderr
    assert "removed: child.txt" in done.stderr
    assert not (world.ws / "child.txt").exists()


# -- forks of hostile ledgers -----------------------------------------------------------------


def test_a_fork_copies_unknown_plugin_newer_and_huge_lines_value_for_value(
        tmp_path: Path) -> None:
    sessions = tmp_path / "sessions"
    cfg = _config(tmp_path)
    path = _ledger(sessions, SID, [(str(tmp_path), []), (None, [])])
    lines = _lines(path)
    odd = [{"type": "future/thing", "payload": {"a": [1, 2.5, {"b": None}]},
            "z": "\u00e9\u2028\u202e\U0001f600"},
           {"type": "x/plug/ev", "plugin": "plug", "name": "ev", "data": {"k": "v"},
            "version": 3, "newer": True},
           {"type": "user/message", "text": "hi", "source": "user", "from_2030": {"x": 1}},
           {"type": "session/fork", "parent": "elsewhere", "turn": 9, "parent_seq": 3,
            "reason": "fork", "mystery": 1},
           {"type": "x/plug/big", "plugin": "plug", "name": "big",
            "data": {"s": "A" * (4 << 20)}, "version": 1}]
    mixed = lines[:2] + [{"v": 1, "seq": 0, "ts": TS, "session": SID, **d} for d in odd] + \
        lines[2:]
    for i, d in enumerate(mixed):
        d["seq"] = i
    path.write_text("".join(json.dumps(d, ensure_ascii=False) + "\n" for d in mixed))
    old = os.umask(0)
    try:
        done = _dsh(cfg, "sessions", "fork", SID, "--at", "1")
    finally:
        os.umask(old)
    assert done.returncode == 0, done.stderr
    new = done.stdout.strip()
    made = sessions / f"{new}.jsonl"
    assert made.stat().st_mode & 0o777 == 0o600
    copied = _lines(made)
    assert copied[0]["type"] == "session/fork" and copied[0]["parent"] == SID
    assert copied[0]["parent_seq"] == mixed[-4]["seq"]  # the last line of turn 1
    assert [d["seq"] for d in copied] == list(range(len(copied)))
    assert {d["session"] for d in copied} == {new}
    for mine, theirs in zip(copied[1:], mixed):
        assert mine["type"] == theirs["type"]  # every value of the parent's line kept (dsh's
        assert {k: mine.get(k) for k in theirs if k not in ("seq", "session")} == {
            k: v for k, v in theirs.items() if k not in ("seq", "session")}  # defaults added)
    assert len(copied) == len(mixed) - 3 + 1  # turn 2's three lines left out
    assert not [n for n in os.listdir(sessions) if n.endswith(".tmp")]
    resumed = _dsh(cfg, "run", "--session", new, "go on")
    assert resumed.returncode == 0 and resumed.stdout.strip() == "go on", resumed.stderr


@pytest.mark.parametrize("damage", ["gap", "repeat", "not-json", "surrogate"])
def test_a_parent_with_a_bad_line_in_the_middle_forks_nothing(tmp_path: Path,
                                                              damage: str) -> None:
    sessions = tmp_path / "sessions"
    cfg = _config(tmp_path)
    path = _ledger(sessions, SID, [(str(tmp_path), []), (None, []), (None, [])])
    rows = path.read_text().split("\n")
    bad = json.loads(rows[4])  # turn 2's user/message
    if damage == "gap":
        bad["seq"] += 5
    elif damage == "repeat":
        bad["seq"] -= 1
    rows[4] = ("{not json" if damage == "not-json" else
               json.dumps(bad).replace('"message', '"\\udcffmessage') if damage == "surrogate"
               else json.dumps(bad))
    path.write_text("\n".join(rows))
    before = sorted(os.listdir(sessions))
    done = _dsh(cfg, "sessions", "fork", SID)
    assert done.returncode != 0 and "Traceback" not in done.stderr, done.stderr
    assert f"{SID}.jsonl:5" in done.stderr
    assert sorted(os.listdir(sessions)) == before


@pytest.mark.parametrize("arg", ["../sessions/" + SID, "/etc/passwd", f"{SID}.jsonl",
                                 "./" + SID, "", "..", "-" * 300])
def test_a_session_argument_that_is_a_path_names_no_file(tmp_path: Path, arg: str) -> None:
    sessions = tmp_path / "sessions"
    cfg = _config(tmp_path)
    _ledger(sessions, SID, [(str(tmp_path), [])])
    before = _tree(tmp_path)
    for cmd in (["fork", arg], ["rewind", arg, "--to", "0", "--files"]):
        done = _dsh(cfg, "sessions", *cmd, cwd=tmp_path)
        assert done.returncode == 2 and not done.stdout, (cmd, done.stdout, done.stderr)
        assert "Traceback" not in done.stderr
    assert {k: v for k, v in _tree(tmp_path).items() if ".index" not in k} == {
        k: v for k, v in before.items() if ".index" not in k}


def test_latest_and_a_prefix_resolve_to_the_session(tmp_path: Path) -> None:
    sessions = tmp_path / "sessions"
    cfg = _config(tmp_path)
    _ledger(sessions, SID, [(str(tmp_path), [])])
    for arg in ("latest", SID[:15], SID[-6:]):
        done = _dsh(cfg, "sessions", "fork", arg)
        assert done.returncode == 0, done.stderr
        assert f"forked {SID} as" in done.stderr
        head = _lines(sessions / f"{done.stdout.strip()}.jsonl")[0]
        assert head["type"] == "session/fork"


def test_a_fork_never_replaces_an_existing_session(tmp_path: Path) -> None:
    sessions = tmp_path / "sessions"
    _ledger(sessions, SID, [(str(tmp_path), [])])
    victim = _ledger(sessions, KID, [(str(tmp_path), []), (None, [])])
    kept = victim.read_bytes()
    code = ("import sys\nfrom pathlib import Path\nfrom dsh.ledger.store import JsonlStore\n"
            "from dsh.ledger.fork import fork\nfrom dsh.core.errors import UsageError\n"
            f"s = JsonlStore(Path({str(sessions)!r}))\n"
            "try:\n"
            f"    fork(s, {SID!r}, new_id={KID!r})\n"
            "except UsageError as e:\n    print(e); sys.exit(3)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=_env(), timeout=60)
    assert done.returncode == 3, (done.stdout, done.stderr)
    assert "already exists" in done.stdout
    assert victim.read_bytes() == kept
    assert not [n for n in os.listdir(sessions) if n.endswith(".tmp")]


# -- a property over generated paths ----------------------------------------------------------

hypothesis = pytest.importorskip("hypothesis")
st = hypothesis.strategies

_PART = st.sampled_from(["a", "b.txt", ".", "..", "", " ", "\\", "é", "\u202e", ".git",
                         ".GIT", "sessions", "x" * 60, "\x00", "\n", "AGENTS.md", "/"])


@hypothesis.settings(max_examples=25, deadline=None, derandomize=True,
                     suppress_health_check=list(hypothesis.HealthCheck))
@hypothesis.given(parts=st.lists(_PART, min_size=1, max_size=5),
                  lead=st.sampled_from(["", "/", "./", "../"]))
def test_property_a_recreated_file_lands_beneath_the_workspace_or_nowhere(
        parts: list[str], lead: str) -> None:
    path = lead + "/".join(parts)
    tmp = Path(tempfile.mkdtemp(prefix="dsh-fork-prop-"))
    try:
        w = World(tmp, sessions=tmp / "ws" / "sessions")
        _ledger(w.sessions, SID, [(str(w.ws), []), (None, [[_delete(path, b"p\n")]])])
        before = w.snapshot()
        done = w.rewind()
        assert "Traceback" not in done.stderr, (path, done.stderr)
        after = w.snapshot()
        new = {k: v for k, v in after.items() if before.get(k) != v
               and not k.startswith("ws/sessions/")}
        assert all(k.startswith("ws/") for k in new), (path, new)  # never outside
        if done.returncode == 0:
            assert [v for v in new.values() if v != "dir"] == [b"p\n"], (path, new)
            made = next(k for k, v in new.items() if v == b"p\n")
            assert made == "ws/" + "/".join(p for p in path.split("/") if p not in ("", "."))
            assert not made.split("/")[1].casefold().startswith((".git", "agents.md"))
        else:
            assert done.returncode == 2, (path, done.stderr)
            assert after == before, (path, new)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
