"""``dsh sessions rm --older-than DAYS [--dry-run]`` (issue 37, item 4): sessions last written
more than DAYS ago are removed through the store (a locked one is kept, exit 1); a dry run
removes nothing; a symbolic link is never followed, removed or counted; the ids form and the
age form are not mixed."""

from __future__ import annotations

import fcntl
import os
import time
from pathlib import Path

from dsh.ledger.store import JsonlStore
from tests.test_session_search import env as env  # noqa: F401 - the fixture
from tests.test_session_search import folder
from tests.test_session_search import make
from tests.test_session_search import run
from tests.test_session_search import sid


def age(path: Path, days: float) -> None:
    then = time.time() - days * 86400
    os.utime(path, (then, then), follow_symlinks=False)


def test_prune_removes_only_what_is_older_and_a_dry_run_nothing(env: dict[str, str],
                                                                tmp_path: Path) -> None:
    store = JsonlStore(folder(env))
    old = [make(store, sid(i), f"old {i}") for i in range(3)]
    new = make(store, sid(5), "new")
    for p in old:
        age(p, 40)
    age(new, 2)
    # an old ledger outside, linked in: neither the link nor what it points to is touched
    outside = make(JsonlStore(tmp_path / "outside"), sid(9), "outside")
    age(outside, 400)
    link = folder(env) / f"{sid(8)}.jsonl"
    os.symlink(outside, link)
    proc = run(env, "sessions", "rm", "--older-than", "30", "--dry-run")
    assert proc.returncode == 0 and proc.stdout == ""
    assert [ln for ln in proc.stderr.splitlines() if "would remove /" in ln] == \
        [f"dsh: would remove {p}" for p in old]
    assert "would remove 3 sessions last written more than 30 days ago" in proc.stderr
    assert all(p.exists() for p in [*old, new, outside]) and link.is_symlink()
    # one of them is in use by a running dsh: kept, named, exit 1; the others go
    fd = os.open(old[1], os.O_RDONLY)
    fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        proc = run(env, "sessions", "rm", "--older-than", "30")
    finally:
        os.close(fd)
    assert proc.returncode == 1, proc.stderr
    assert f"kept {sid(1)}" in proc.stderr and "in use" in proc.stderr
    assert f"dsh: removed {old[0]}" in proc.stderr and "removed 2 sessions" in proc.stderr
    assert not old[0].exists() and not old[2].exists() and old[1].exists()
    assert new.exists() and outside.exists() and link.is_symlink()
    proc = run(env, "sessions", "rm", "--older-than", "1.5")
    assert proc.returncode == 0 and not new.exists() and not old[1].exists()
    assert outside.exists() and link.is_symlink()
    listed = run(env, "sessions", "list", "--json")
    assert listed.stdout.strip() == "[]"


def test_rm_takes_ids_or_an_age(env: dict[str, str]) -> None:
    store = JsonlStore(folder(env))
    path = make(store, sid(1), "x")
    for args, message in [((), "--older-than DAYS"), ((sid(1), "--older-than", "3"), "not both"),
                          (("--older-than", "0"), "0"), (("--older-than", "soon"), "soon")]:
        proc = run(env, "sessions", "rm", *args)
        assert proc.returncode == 2 and message in proc.stderr, (args, proc.stderr)
    proc = run(env, "sessions", "rm", "--dry-run", sid(1))
    assert proc.returncode == 0 and f"would remove {path}" in proc.stderr and path.exists()
    proc = run(env, "sessions", "rm", sid(1))
    assert proc.returncode == 0 and not path.exists()
