"""dsh-shell under attack: what a command can reach of dsh's secrets, how much output it can
make dsh keep, writing through links, and signals that end dsh while a command runs.

The secret scans run the whole ``dsh run`` in a child process, once as the current user
(root on CI) and once dropped to user ``nobody`` with ``setpriv``, because what a command can
read of ``/proc/<dsh pid>`` depends on who it runs as (docs: security).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Callable
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st

from dsh.core.errors import ToolError
from dsh.run.app import App

dsh_shell = pytest.importorskip("dsh_shell", reason="pip install ./plugins/dsh-shell")
from dsh_shell import process  # noqa: E402
from dsh_shell import workspace  # noqa: E402

from tests.procs import alive_with as _alive_with  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
MARK = "S3CR3T-7f3a9c"  # every secret below contains it; the probe looks for it
SECRETS = {
    "OPENAI_API_KEY": f"sk-{MARK}-openai",
    "SSHPASS": f"{MARK}-sshpass",
    "MYSQL_PWD": f"{MARK}-mysql",
    "DATABASE_URL": f"postgres://app:{MARK}-db@db/app",
    "HTTPS_PROXY": f"http://user:{MARK}-proxy@proxy:3128",
    "http_proxy": f"http://user:{MARK}-proxy2@proxy:3128",
    "SENTRY_DSN": f"https://{MARK}-sentry@o1.ingest.sentry.io/1",
    "GH_PAT": f"ghp_{MARK}-pat",
}

#: A hostile command: looks for MARK everywhere it can reach and writes what it found (never
#: the secret itself) to report.json.
PROBE = textwrap.dedent("""
    import json, os, sys
    MARK = sys.argv[1][::-1].encode()  # given reversed: the command line holds no secret
    report = {}

    def look(name, read):
        try:
            data = read()
        except OSError as exc:
            report[name] = "denied: " + type(exc).__name__
            return
        report[name] = "FOUND" if MARK in data else "clean"

    def path(p, limit=1 << 20):
        def read():  # never blocks: a pipe or terminal without data reads as empty
            fd = os.open(p, os.O_RDONLY | os.O_NONBLOCK)
            try:
                return os.read(fd, limit)
            except BlockingIOError:
                return b""
            finally:
                os.close(fd)
        return read

    look("own environment", lambda: repr(dict(os.environ)).encode())
    look("/proc/self/environ", path("/proc/self/environ"))
    for fd in sorted(int(x) for x in os.listdir("/proc/self/fd")):
        look(f"own fd {fd}", path(f"/proc/self/fd/{fd}", 1 << 16))

    def mem(pid):
        def read():
            found = b""
            with open(f"/proc/{pid}/maps") as maps, open(f"/proc/{pid}/mem", "rb") as m:
                for line in maps:
                    lo, hi = (int(x, 16) for x in line.split()[0].split("-"))
                    if "r" not in line.split()[1] or hi - lo > 1 << 28:
                        continue
                    try:
                        m.seek(lo)
                        chunk = m.read(hi - lo)
                    except (OSError, ValueError, OverflowError):
                        continue
                    if MARK in chunk:
                        return MARK
            return found
        return read

    pid = os.getppid()
    report["parent uid of environ"] = os.stat(f"/proc/{pid}/environ").st_uid
    depth = 0
    while pid > 0 and depth < 6:  # in its own PID namespace, the parent is its init: 1
        who = "dsh" if depth == 0 else f"ancestor {depth}"
        look(f"{who} environ", path(f"/proc/{pid}/environ"))
        look(f"{who} cmdline", path(f"/proc/{pid}/cmdline"))
        for task in os.listdir(f"/proc/{pid}/task"):
            look(f"{who} task environ", path(f"/proc/{pid}/task/{task}/environ"))
        if depth == 0:
            look("dsh mem", mem(pid))
            try:
                fds = os.listdir(f"/proc/{pid}/fd")
            except OSError as exc:
                report["dsh fds"] = "denied: " + type(exc).__name__
            else:
                for fd in fds:
                    look(f"dsh fd {fd}", path(f"/proc/{pid}/fd/{fd}", 1 << 20))
        with open(f"/proc/{pid}/status") as f:
            pid = int(next(l for l in f if l.startswith("PPid:")).split()[1])
        depth += 1
    with open("report.json", "w") as f:
        json.dump(report, f, indent=1)
    print("probed", len(report), "channels")
""")


def _can_drop_privileges() -> str | None:
    if os.geteuid() != 0:
        return "not root: cannot switch to user nobody (the current user is the normal user)"
    if shutil.which("setpriv") is None:
        return "setpriv (util-linux) is not installed"
    return None


@pytest.fixture
def shared_dir() -> Iterator[Path]:
    """A directory user nobody can use: pytest's tmp_path is root-only."""
    path = Path(tempfile.mkdtemp(prefix="dsh-hardening-"))
    path.chmod(0o755)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def _probe_run(base: Path,
               uid: int | None) -> tuple[dict[str, Any], subprocess.CompletedProcess[str]]:
    """``dsh run --yes`` whose scripted model runs PROBE; as ``uid`` when given."""
    ws, home, sessions = base / "ws", base / "home", base / "sessions"
    for d in (ws, home, sessions):
        d.mkdir()
    (ws / "probe.py").write_text(PROBE)
    # The probe needs an interpreter the user can execute (a venv under /root is not one).
    python = sys.executable
    if uid is not None:
        python = next((p for p in ("/usr/bin/python3", "/usr/local/bin/python3")
                       if os.path.exists(p) and os.stat(p).st_mode & 0o001), "")
        if not python:
            pytest.skip("no python3 that user nobody can execute, for the probe")
    script = base / "script.json"
    script.write_text(json.dumps({"responses": [
        {"tool_calls": [{"name": "run_command",
                         "arguments": {"command": f"{python} probe.py {MARK[::-1]}"}}]},
        {"text": "done"}]}))
    config = base / "dsh.toml"
    config.write_text(f'sessions_dir = {json.dumps(str(sessions))}\n'
                      f'[plugins.shell]\nworkspace = {json.dumps(str(ws))}\n')
    for p in (ws, home, sessions, script, config, ws / "probe.py"):
        if uid is not None:
            os.chown(p, uid, uid)
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(home),
           "DSH_HOME": str(home), "XDG_CONFIG_HOME": str(home), "LANG": "C.UTF-8",
           "NO_COLOR": "1", **SECRETS}
    if "PYTHONPATH" in os.environ:
        env["PYTHONPATH"] = os.environ["PYTHONPATH"]
    cmd = [sys.executable, "-m", "dsh", "--config", str(config), "run", "--yes", "--json",
           "-m", f"scripted:{script}", "probe"]
    if uid is not None:
        cmd = ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", *cmd]
    proc = subprocess.run(cmd, env=env, cwd=str(ws), capture_output=True, text=True,
                          timeout=120, stdin=subprocess.DEVNULL, start_new_session=True)
    assert proc.returncode == 0, proc.stderr
    report_file = ws / "report.json"
    if not report_file.exists():  # the tool's result says why
        results = [json.loads(line) for f in sessions.glob("*.jsonl")
                   for line in f.read_text().splitlines()]
        pytest.fail(f"the probe did not run: {[e for e in results if e['type'] == 'tool/result']}")
    report = json.loads(report_file.read_text())
    return report, proc


def test_a_command_running_as_a_normal_user_cannot_read_dshs_secrets(shared_dir: Path) -> None:
    """As a normal user, nothing the command can reach holds a secret: its environment is
    built from an allowlist, and dsh is non-dumpable, so /proc/<dsh>/environ and mem belong to
    root. (CI runs as root: the whole dsh run is dropped to user nobody.)"""
    reason = _can_drop_privileges()
    if reason is not None and os.geteuid() == 0:
        pytest.skip(reason)
    uid = 65534 if os.geteuid() == 0 else None
    report, proc = _probe_run(shared_dir, uid)
    found = sorted(k for k, v in report.items() if v == "FOUND")
    assert found == [], f"a command running as uid {uid} read a secret through {found}"
    # The channels that would leak without the protection were really tried, and refused.
    assert report["dsh environ"].startswith("denied"), report
    assert report["dsh mem"].startswith("denied"), report
    # the kernel's mark of a non-dumpable process: root's — shown as the overflow id 65534
    # inside a user namespace that does not map root
    assert report["parent uid of environ"] in (0, 65534)
    assert report["/proc/self/environ"] == "clean" and report["own environment"] == "clean"
    assert report["dsh cmdline"] == "clean"
    for text in (proc.stdout, proc.stderr, *(p.read_text() for p in
                                             (shared_dir / "sessions").glob("*.jsonl"))):
        assert MARK not in text


def test_a_command_running_as_root_gets_no_secret_in_its_own_environment_or_fds(
        shared_dir: Path) -> None:
    """As root, the allowlisted environment and the closed descriptors still hold; reading
    /proc/<dsh>/environ or mem is root's privilege (CAP_SYS_PTRACE) and is NOT prevented —
    docs/security.md says so. This test pins what holds and records what does not."""
    if os.geteuid() != 0:
        pytest.skip("runs as root only (the normal-user case is the test above)")
    report, _ = _probe_run(shared_dir, None)
    own = {k: v for k, v in report.items()
           if k.startswith(("own ", "/proc/self")) or k == "dsh cmdline"}
    assert own and "FOUND" not in own.values(), json.dumps(report)
    # No descriptor of dsh was inherited: 0-2, and the one listing /proc/self/fd.
    assert {k for k in report if k.startswith("own fd ")} <= {f"own fd {n}" for n in range(4)}
    found = {k for k, v in report.items() if v == "FOUND"}
    # Only what root may read of another process can hold the key: nothing dsh gave it.
    assert found <= {"dsh environ", "dsh task environ", "dsh mem"}, found


@given(st.dictionaries(st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,20}", fullmatch=True),
                      st.text(st.characters(blacklist_categories=("Cs",),
                                            blacklist_characters="\0"), max_size=20),
                      max_size=15))
@settings(max_examples=200, deadline=None)
def test_the_environment_of_a_command_is_an_allowlist(extra: dict[str, str]) -> None:
    saved = dict(os.environ)
    try:
        os.environ.update(extra)
        env = process.child_env(("KEPT_ONE", "PFX_*"), "/work")
    finally:
        os.environ.clear()
        os.environ.update(saved)
    base = {n for n in process.BASE_ENV if "*" not in n} | {"KEPT_ONE", "PWD"}
    for name in env:
        assert name in base or name.startswith(("LC_", "PFX_")), name
    assert env["PWD"] == "/work"
    for name in ("KEPT_ONE", "PATH"):
        if name in extra:
            assert env[name] == extra[name]


def test_hardening_makes_the_process_non_dumpable_once_and_cheaply() -> None:
    """In a fresh interpreter: measured, and /proc/self/environ becomes root's."""
    code = textwrap.dedent("""
        import json, os, time
        from dsh_shell import process
        before = os.stat("/proc/self/environ").st_uid
        t = time.perf_counter()
        why = process.harden_process()
        took = time.perf_counter() - t
        again = process.harden_process()
        print(json.dumps([before, os.stat("/proc/self/environ").st_uid, why, again, took]))
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60, check=True).stdout
    before, after, why, again, took = json.loads(out)
    assert (why, again) == ("", "")
    assert after == 0  # owned by root once non-dumpable, whoever runs it
    assert took < 0.25  # ctypes import 2-20 ms + prctl ~5 us; generous for a loaded CI box


# --------------------------------------------------------------------------------------------
# Output: never more than max_output kept, whatever the command prints
# --------------------------------------------------------------------------------------------


@pytest.fixture
def make(tmp_path: Path) -> Callable[..., App]:
    ws = tmp_path / "ws"
    ws.mkdir()

    def build(**shell: Any) -> App:
        settings_ = {"workspace": str(ws), "tty": str(tmp_path / "no-terminal"), **shell}
        return App.from_config({"sessions_dir": str(tmp_path / "sessions"),
                                "plugins": {"shell": settings_},
                                "agents": {"a": {"plugins": ["shell"]}}})

    return build


def run_tool(app: App, command: str) -> str:
    return app.agent("a").tools["run_command"].fn(command=command)


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"


@pytest.mark.parametrize("command", [
    "cat /dev/zero",
    "sh -c 'cat /dev/zero >&2'",
    "sh -c 'yes & yes >&2'",
])
def test_endless_output_is_cut_and_the_command_killed(
        make: Callable[..., App], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        command: str) -> None:
    spool = tmp_path / "tmp"
    spool.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(spool))
    monkeypatch.setenv("TMPDIR", str(spool))
    app = make(allow=["cat", "sh"], max_output=1000, timeout=30)
    start = time.monotonic()
    out = run_tool(app, command)
    assert time.monotonic() - start < 10
    limit = process.drain_limit(1000)
    assert out.startswith(f"killed: the command printed more than {limit} bytes")
    assert "(cut: " in out
    assert len(out.encode()) < 1000 + 400  # the kept output plus the notes
    assert list(spool.iterdir()) == []  # nothing spooled to disk


def test_a_killed_flood_takes_its_process_group_with_it(make: Callable[..., App],
                                                        tmp_path: Path) -> None:
    app = make(allow=["sh"], max_output=100, timeout=30)
    mark = f"300.{os.getpid()}{time.monotonic_ns() % 10**6}"  # a duration no other sleep has
    out = run_tool(app, f"sh -c 'sleep {mark} & echo $! > bg.pid; cat /dev/zero'")
    assert out.startswith("killed:")
    assert (tmp_path / "ws" / "bg.pid").exists()  # the background child was started
    deadline = time.monotonic() + 5
    while _alive_with(f"sleep\0{mark}") and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _alive_with(f"sleep\0{mark}") == []


def test_a_background_child_holding_the_pipe_does_not_hold_the_call(
        make: Callable[..., App], tmp_path: Path) -> None:
    app = make(allow=["sh"], timeout=30)
    start = time.monotonic()
    out = run_tool(app, "sh -c 'sleep 5 & echo $! > bg.pid; echo hi'")
    assert time.monotonic() - start < 3
    assert out == "exit code: 0\n--- stdout ---\nhi"
    # (no kill of the pid it wrote: that is its own namespace's number, and the child is gone
    # with the call — or, without namespaces, ends on its own)


@pytest.mark.parametrize("size", [0, 1, 999, 1000, 1001, 5000, 300_000])
def test_output_around_the_limit_is_whole_or_cut_with_its_size(
        make: Callable[..., App], size: int) -> None:
    app = make(allow=["head"], max_output=1000)
    out = run_tool(app, f"head -c {size} /dev/zero")
    assert out.startswith("exit code: 0\n")
    if size == 0:
        assert out == "exit code: 0\n(no output)"
    elif size <= 1000:
        assert out == "exit code: 0\n--- stdout ---\n" + "\0" * size
    else:
        assert f"--- stdout (cut: {size} bytes, showing the first 750 and the last 250) ---" in out
        assert out.count("\0") == 1000


@given(st.lists(st.binary(min_size=1, max_size=3000), min_size=1, max_size=30),
       st.integers(min_value=4, max_value=4000), st.data())
@settings(max_examples=300, deadline=None)
def test_a_stream_keeps_its_beginning_and_end_within_its_limit(
        chunks: list[bytes], keep: int, data: st.DataObject) -> None:
    stream = process.Stream(keep)
    for chunk in chunks:
        stream.feed(chunk)
    whole = b"".join(chunks)
    assert stream.size == len(whole)
    assert len(stream.head) <= keep and len(stream.tail) <= keep
    take = data.draw(st.integers(min_value=0, max_value=keep))
    note, text = stream.text(take)
    if len(whole) <= take:
        assert (note, text) == ("", whole.decode("utf-8", errors="replace"))
        return
    head_n, tail_n = take - take // 4, take // 4
    first = whole[:head_n].decode("utf-8", "replace")
    if not tail_n:
        assert note == f"cut: first {head_n} of {len(whole)} bytes"
        assert first.startswith(text)
        return
    assert note == (f"cut: {len(whole)} bytes, showing the first {head_n} and the last "
                    f"{tail_n}")
    shown, last = text.split(f"\n[… {len(whole) - head_n - tail_n} bytes cut …]\n")
    assert first.startswith(shown)  # at most a split character held back
    start = len(whole) - tail_n
    assert any(last == whole[start + k:].decode("utf-8", "replace") for k in range(4))


# --------------------------------------------------------------------------------------------
# write_file through links
# --------------------------------------------------------------------------------------------


def test_write_file_through_a_hard_link_leaves_the_outside_file_alone(
        make: Callable[..., App], tmp_path: Path) -> None:
    outside = tmp_path / "outside.txt"
    outside.write_text("outside, keep me\n")
    link = tmp_path / "ws" / "link.txt"
    os.link(outside, link)
    write = make().agent("a").tools["write_file"].fn
    result = write(path="link.txt", content="new\n")
    first, _, diff = result.partition("\n")
    assert first == ("replaced link.txt (4 bytes); it had 1 other hard link(s), which keep "
                     "the old content")
    assert "-outside, keep me\n+new" in diff  # the model reads the diff of its write
    assert outside.read_text() == "outside, keep me\n"
    assert link.read_text() == "new\n" and os.stat(link).st_nlink == 1


def test_write_file_keeps_the_mode_and_leaves_no_temporary_file(
        make: Callable[..., App], tmp_path: Path) -> None:
    target = tmp_path / "ws" / "run.sh"
    target.write_text("old\n")
    target.chmod(0o750)
    write = make().agent("a").tools["write_file"].fn
    assert write(path="run.sh", content="new\n").endswith("@@ -1 +1 @@\n-old\n+new")
    assert target.stat().st_mode & 0o777 == 0o750 and target.read_text() == "new\n"
    assert sorted(p.name for p in target.parent.iterdir()) == ["run.sh"]


def test_write_file_refuses_a_symlink_to_the_outside_and_one_swapped_in_after_the_check(
        make: Callable[..., App], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    outside = tmp_path / "outside.txt"
    outside.write_text("outside, keep me\n")
    ws = tmp_path / "ws"
    (ws / "evil").symlink_to(outside)
    write = make().agent("a").tools["write_file"].fn
    with pytest.raises(ToolError, match="goes through a symlink that leads outside"):
        write(path="evil", content="pwned")
    # The race: the check saw a plain file "evil", then a symlink took its place.
    monkeypatch.setattr(workspace, "resolve", lambda root, path: "evil")
    with pytest.raises(ToolError, match="changed while it was being opened"):
        write(path="evil", content="pwned")
    assert outside.read_text() == "outside, keep me\n" and (ws / "evil").is_symlink()
    assert sorted(p.name for p in ws.iterdir()) == ["evil"]


# --------------------------------------------------------------------------------------------
# SIGTERM / SIGHUP while a command runs
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("signum", "code"), [(signal.SIGTERM, 143), (signal.SIGHUP, 129)])
def test_a_terminating_signal_kills_the_command_tree_and_closes_the_turn(
        tmp_path: Path, signum: int, code: int) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    script = tmp_path / "script.json"
    mark = f"1000.{os.getpid()}{time.monotonic_ns() % 10**6}"  # no other sleep has it
    command = f"sh -c 'echo $$ > pids; sleep {mark} & echo $! >> pids; wait'"
    script.write_text(json.dumps({"responses": [
        {"tool_calls": [{"name": "run_command", "arguments": {"command": command}}]},
        {"text": "resumed fine"}]}))
    config = tmp_path / "dsh.toml"
    config.write_text(f'sessions_dir = {json.dumps(str(tmp_path / "sessions"))}\n'
                      f'[plugins.shell]\nworkspace = {json.dumps(str(ws))}\nallow = ["sh"]\n')
    env = {**os.environ, "NO_COLOR": "1"}
    env.pop("DSH_LOAD_PLUGINS", None)
    base = [sys.executable, "-m", "dsh", "--config", str(config), "run",
            "-m", f"scripted:{script}"]
    proc = subprocess.Popen([*base, "sleep"], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True,
                            start_new_session=True)
    pids_file = ws / "pids"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and len(_lines(pids_file)) < 2:
        time.sleep(0.05)
    assert len(_lines(pids_file)) == 2, "the command did not start"
    # the shell (its script holds the mark) and its sleep, as this process sees them
    assert len(_alive_with(mark)) >= 2
    proc.send_signal(signum)
    try:
        _, err = proc.communicate(timeout=20)
    finally:
        proc.kill()
    assert proc.returncode == code, err
    assert f"terminated by {signal.Signals(signum).name}" in err
    assert "Traceback" not in err
    deadline = time.monotonic() + 5
    while _alive_with(mark) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _alive_with(mark) == [], "a process of the command's tree survived"
    [ledger] = (tmp_path / "sessions").glob("*.jsonl")
    events = [json.loads(line) for line in ledger.read_text().splitlines()]
    assert events[-1]["type"] == "turn/end" and events[-1]["outcome"] == "aborted"
    assert events[-1]["reason"] == f"terminated by {signal.Signals(signum).name}"
    assert [e["status"] for e in events if e["type"] == "tool/result"] == ["interrupted"]
    resumed = subprocess.run([*base, "--session", ledger.stem, "go on"], env=env,
                             capture_output=True, text=True, timeout=60,
                             stdin=subprocess.DEVNULL, start_new_session=True)
    assert resumed.returncode == 0, resumed.stderr
    assert resumed.stdout == "resumed fine\n"


def _lines(path: Path) -> list[str]:
    try:
        return [line for line in path.read_text().splitlines() if line.strip()]
    except FileNotFoundError:
        return []


