"""The confined child prepared by the parent (dsh/sandbox/child.py), the path
:class:`dsh.sandbox.Popen` uses, against the launcher it replaced (``launcher=True``, still
the path of ``wrap``): the same confinement, the same failures, and no hang when a process
full of threads spawns hundreds of confined commands (``preexec_fn``'s documented risk).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from dsh.sandbox.policy import Policy
from dsh.sandbox.spawn import Popen
from dsh.sandbox.spawn import SandboxUnavailable
from dsh.sandbox.spawn import check

_CHECK = check()
needs_sandbox = pytest.mark.skipif(not _CHECK.get("backend"),
                                   reason=f"no sandbox on this machine: {_CHECK.get('why')}")
SRC = str(Path(__file__).resolve().parents[1])

PROBE = """
    import json, os, sys
    out = {"fds": sorted(int(f) for f in os.listdir("/proc/self/fd"))}
    out["status"] = {l.split(":")[0]: l.split(":", 1)[1].strip()
                     for l in open("/proc/self/status")
                     if l.startswith(("CapEff", "CapPrm", "CapBnd", "CapInh", "CapAmb",
                                      "NoNewPrivs", "Seccomp:"))}
    for name, path in (("secret", sys.argv[1]), ("outside", sys.argv[2])):
        try:
            if name == "secret":
                open(path).read()
            else:
                open(path, "w").close()
            out[name] = "ok"
        except OSError as exc:
            out[name] = type(exc).__name__
    open("inside", "w").write("x")
    print(json.dumps(out))
"""


@needs_sandbox
@pytest.mark.parametrize("launcher", [False, True], ids=["in-child", "launcher"])
def test_both_paths_confine_the_same(tmp_path: Path, launcher: bool) -> None:
    import json

    ws, dsh_dir, outside = tmp_path / "ws", tmp_path / "dsh", tmp_path / "outside"
    for d in (ws, dsh_dir, outside):
        d.mkdir()
    (dsh_dir / "keys.json").write_text("S3CR3T")
    leak = os.open(dsh_dir / "keys.json", os.O_RDONLY)
    os.set_inheritable(leak, True)  # an inheritable descriptor of "dsh" must still not pass
    try:
        proc = Popen([sys.executable, "-c", textwrap.dedent(PROBE), str(dsh_dir / "keys.json"),
                      str(outside / "x")], Policy(), workspace=str(ws),
                     protected=[str(dsh_dir)], stdout=subprocess.PIPE, launcher=launcher)
        out, _ = proc.communicate(timeout=60)
    finally:
        os.close(leak)
    report = json.loads(out)
    assert proc.returncode == 0
    assert report["fds"] == [0, 1, 2, 3]  # 3: the directory listdir opened
    assert report["status"] == {"CapInh": "0000000000000000", "CapPrm": "0000000000000000",
                                "CapEff": "0000000000000000", "CapBnd": "0000000000000000",
                                "CapAmb": "0000000000000000", "NoNewPrivs": "1",
                                "Seccomp": "2"}
    assert (report["secret"], report["outside"]) == ("PermissionError", "PermissionError")
    assert list(outside.iterdir()) == [] and (ws / "inside").read_text() == "x"
    assert proc.sandbox["backend"] == "landlock" and proc.sandbox["abi"] >= 6


@needs_sandbox
@pytest.mark.parametrize("launcher", [False, True], ids=["in-child", "launcher"])
def test_a_missing_or_unreadable_program_is_the_error_subprocess_gives(
        tmp_path: Path, launcher: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    import tempfile

    ws, elsewhere, tmp = tmp_path / "ws", tmp_path / "elsewhere", tmp_path / "tmp"
    for d in (ws, elsewhere, tmp):
        d.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))  # where the commands' temp dirs go
    tool = elsewhere / "tool"  # executable, but outside what the sandbox may read
    tool.write_text("#!/bin/sh\necho ran\n")
    tool.chmod(0o755)
    (ws / "not-exec").write_text("data")
    before = sorted(os.listdir("/proc/self/fd"))
    with pytest.raises(FileNotFoundError) as missing:
        Popen(["no-such-program-dsh"], Policy(), workspace=str(ws), launcher=launcher)
    assert missing.value.filename == "no-such-program-dsh"
    for argv in ([str(tool)], [str(ws / "not-exec")]):
        with pytest.raises(PermissionError):
            Popen(argv, Policy(), workspace=str(ws), launcher=launcher)
    assert sorted(os.listdir("/proc/self/fd")) == before  # no descriptor left behind
    assert list(tmp.iterdir()) == []  # nor a temp directory


# A seccomp filter in the test's process that makes landlock_restrict_self fail (EPERM) while
# the parent can still build the ruleset: the failure happens in the child, after the fork.
NO_RESTRICT = """
    import ctypes, json, os, struct, subprocess, sys, tempfile
    sys.path.insert(0, {src!r})
    from dsh.sandbox import exec as launcher
    arch, nrs, _ = launcher.ARCHES[os.uname().machine]
    prog = [(0x20, 0, 0, 4), (0x15, 1, 0, arch), (0x06, 0, 0, 0x7FFF0000),
            (0x20, 0, 0, 0), (0x15, 0, 1, 446), (0x06, 0, 0, 0x00050000 | 1),
            (0x06, 0, 0, 0x7FFF0000)]
    code = b"".join(struct.pack("=HBBI", *i) for i in prog)
    libc = ctypes.CDLL(None, use_errno=True)
    buf = ctypes.create_string_buffer(code, len(code))
    class P(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]
    p = P(len(prog), ctypes.cast(buf, ctypes.c_void_p))
    assert libc.prctl(38, 1, 0, 0, 0) == 0 and libc.prctl(22, 2, ctypes.byref(p), 0, 0) == 0
    if sys.argv[1:]:
        os.execv(sys.executable, [sys.executable, *sys.argv[1:]])
    from dsh.sandbox.policy import Policy
    from dsh.sandbox.spawn import Popen, SandboxUnavailable
    ws = tempfile.mkdtemp()
    out = {{}}
    for launcher in (False, True):
        try:
            Popen(["touch", "ran"], Policy(), workspace=ws, launcher=launcher)
            out[str(launcher)] = "ran"
        except SandboxUnavailable as exc:
            out[str(launcher)] = [str(exc), exc.exit_code]
    out["ran"] = os.path.exists(os.path.join(ws, "ran"))
    out["fds"] = len(os.listdir("/proc/self/fd"))
    print(json.dumps(out))
"""


@needs_sandbox
def test_a_call_failing_in_the_child_fails_closed_with_the_launchers_line(
        tmp_path: Path) -> None:
    import json

    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(NO_RESTRICT.format(src=SRC))],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["ran"] is False
    why = ("sandbox: cannot confine the command (landlock_restrict_self failed: Operation not "
           "permitted); it was not run. To run it unconfined, set policy = \"off\" in "
           "[sandbox]")
    assert out["False"] == out["True"] == [why, 126]
    # dsh sandbox run: the same line, exit 126, the command not run
    (tmp_path / "ws").mkdir()
    run = subprocess.run([sys.executable, "-c", textwrap.dedent(NO_RESTRICT.format(src=SRC)),
                          "-m", "dsh", "sandbox", "run", "--", "touch", "ran"],
                         capture_output=True, text=True, timeout=120, cwd=tmp_path / "ws")
    assert run.returncode == 126, run.stderr
    assert run.stderr.splitlines() == [f"dsh: error: {why[:-1]}, agent default]"]
    assert not (tmp_path / "ws" / "ran").exists()


def test_a_failure_before_the_fork_leaves_nothing_open(tmp_path: Path) -> None:
    """A rule path that vanished between the plan and the fork: refused in the parent."""
    from dsh.sandbox.child import Confinement
    from dsh.sandbox.exec import Refused

    before = sorted(os.listdir("/proc/self/fd"))
    try:
        Confinement(False, ((str(tmp_path / "gone"), "read"),))
    except Refused as exc:
        assert "cannot open" in str(exc) or "Landlock" in str(exc) or "ABI" in str(exc)
    else:
        pytest.fail("a missing path was accepted")
    assert sorted(os.listdir("/proc/self/fd")) == before


@needs_sandbox
def test_a_callers_preexec_fn_runs_before_the_confinement(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    marker = tmp_path / "outside-by-preexec"
    proc = Popen(["sh", "-c", f"touch {marker}.by-command; grep ^Seccomp: /proc/self/status"],
                 Policy(), workspace=str(ws), stdout=subprocess.PIPE,
                 stderr=subprocess.DEVNULL, preexec_fn=marker.touch)
    out, _ = proc.communicate(timeout=60)
    assert marker.exists()  # the caller's code ran in the child, unconfined, as before
    assert not Path(f"{marker}.by-command").exists()  # the command did not
    assert out.split() == [b"Seccomp:", b"2"]


def test_a_callers_preexec_fn_that_raises_is_subprocess_own_error(tmp_path: Path) -> None:
    """Not a sandbox refusal: the caller's code failed, as subprocess reports it."""
    ws = tmp_path / "ws"
    ws.mkdir()

    def fail() -> None:
        raise ValueError("the caller's own")

    with pytest.raises(subprocess.SubprocessError, match="preexec_fn") as info:
        Popen(["touch", "ran"], Policy(), workspace=str(ws), preexec_fn=fail)
    assert not isinstance(info.value, SandboxUnavailable)
    assert not (ws / "ran").exists()


@needs_sandbox
def test_a_subinterpreter_without_preexec_fn_gets_the_launcher(tmp_path: Path) -> None:
    si = pytest.importorskip("_xxsubinterpreters")
    code = textwrap.dedent(f"""
        import subprocess
        from dsh.sandbox.spawn import Popen
        from dsh.sandbox.policy import Policy
        try:
            subprocess.Popen(["true"], preexec_fn=lambda: None)
            raise SystemExit("preexec_fn works here: the test proves nothing")
        except RuntimeError:
            pass
        p = Popen(["sh", "-c", "grep ^Seccomp: /proc/self/status > seccomp; touch {tmp_path}/x"],
                  Policy(), workspace={str(tmp_path / 'ws')!r}, stderr=subprocess.DEVNULL)
        assert p.wait() != 0 and p.sandbox["backend"] == "landlock"
    """)
    (tmp_path / "ws").mkdir()
    interp = si.create(isolated=False)
    try:
        si.run_string(interp, code)
    finally:
        si.destroy(interp)
    assert (tmp_path / "ws" / "seccomp").read_text().split() == ["Seccomp:", "2"]
    assert not (tmp_path / "x").exists()


# --------------------------------------------------------------------------------------------
# preexec_fn's risk: a lock held by another thread at fork. Many threads spawn confined
# commands while others import, log, allocate and collect; the run must end (bounded by the
# subprocess timeout), every command must have run confined. The harness does catch a hang:
# a caller's preexec_fn that takes a lock another thread keeps taking hangs it (tried by
# hand; docs/security.md).
# --------------------------------------------------------------------------------------------

STRESS = """
    import gc, importlib, json, logging, os, subprocess, sys, tempfile, threading
    sys.path.insert(0, {src!r})
    from dsh.sandbox.policy import Policy
    from dsh.sandbox.spawn import Popen

    ws = tempfile.mkdtemp()
    mods = tempfile.mkdtemp()
    sys.path.insert(0, mods)
    for i in range(400):
        with open(os.path.join(mods, f"m{{i}}.py"), "w") as f:
            f.write(f"import logging\\nX = [{{i}}] * 100\\nlogging.getLogger('m{{i}}')\\n")
    logging.basicConfig(filename=os.path.join(ws, "..", "log-" + os.path.basename(ws)),
                        level=logging.DEBUG)
    log = logging.getLogger("stress")
    stop = threading.Event()
    results, errors = [], []

    def spawner(n):
        for i in range(n):
            try:
                if i % 10 == 0:
                    p = Popen(["grep", "^Seccomp:", "/proc/self/status"], Policy(),
                              workspace=ws, stdout=subprocess.PIPE)
                    out, _ = p.communicate(timeout=60)
                    results.append(out.split()[-1].decode())
                else:
                    results.append(str(Popen(["true"], Policy(), workspace=ws).wait()))
            except Exception as exc:
                errors.append(repr(exc))

    def importer():
        i = 0
        while not stop.is_set():
            name = f"m{{i % 400}}"
            mod = importlib.import_module(name)
            if i >= 400:
                importlib.reload(mod)
            i += 1

    def logger():
        while not stop.is_set():
            log.info("a line %s", "x" * 200)

    def allocator():
        while not stop.is_set():
            junk = []
            for _ in range(2000):
                a = {{"self": None, "data": bytearray(64)}}
                a["self"] = a
                junk.append(a)
            del junk
            gc.collect(0)

    def plain():
        while not stop.is_set():
            subprocess.run(["true"])

    busy = [threading.Thread(target=f, daemon=True)
            for f in (importer, importer, logger, logger, allocator, plain)]
    for t in busy:
        t.start()
    spawners = [threading.Thread(target=spawner, args=({per},)) for _ in range({threads})]
    for t in spawners:
        t.start()
    for t in spawners:
        t.join()
    stop.set()
    for t in busy:
        t.join()
    print(json.dumps({{"results": results, "errors": errors}}))
"""


@needs_sandbox
def test_many_threads_spawning_confined_commands_never_hang() -> None:
    import json

    threads, per = 8, 40
    code = textwrap.dedent(STRESS.format(src=SRC, threads=threads, per=per))
    # Its own session: on a hang, the whole group goes (children stuck before exec included).
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        stdout, stderr = proc.communicate(timeout=600)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        pytest.fail("spawning confined commands from a busy threaded process hung")
    assert proc.returncode == 0, stderr[-2000:]
    out = json.loads(stdout)
    assert out["errors"] == []
    assert len(out["results"]) == threads * per
    confined = [r for r in out["results"] if r != "0"]
    assert confined == ["2"] * (threads * per // 10)  # Seccomp: 2 in every probed command
    assert out["results"].count("0") == threads * per - threads * per // 10



@needs_sandbox
def test_dsh_sandbox_check_trials_both_paths(tmp_path: Path) -> None:
    import json

    ok = subprocess.run([sys.executable, "-m", "dsh", "sandbox", "check"], capture_output=True,
                        text=True, timeout=120)
    assert ok.returncode == 0, ok.stderr
    assert "backend: landlock — commands are confined" in ok.stdout
    assert "launcher (MCP stdio servers): ok" in ok.stdout
    # landlock_restrict_self refused in the child: both trials fail, the reason is said
    broken = subprocess.run([sys.executable, "-c", textwrap.dedent(NO_RESTRICT.format(src=SRC)),
                             "-m", "dsh", "sandbox", "check", "--json"],
                            capture_output=True, text=True, timeout=120)
    assert broken.returncode == 126, broken.stderr
    info = json.loads(broken.stdout)
    assert info["backend"] is None and info["landlock_abi"] >= 6
    for why in (info["why"], info["launcher"]):
        assert "landlock_restrict_self failed: Operation not permitted" in why


INTERRUPTED = """
    import json, os, signal, sys, time
    sys.path.insert(0, {src!r})
    from dsh.sandbox.policy import Policy
    from dsh.sandbox.spawn import Popen

    def interrupt(*_):
        raise KeyboardInterrupt
    signal.signal(signal.SIGALRM, interrupt)
    ws = sys.argv[1]
    out = {{}}
    for launcher in (False, True):
        signal.setitimer(signal.ITIMER_REAL, 0.3)
        try:  # the caller's preexec_fn holds the child before exec: the interrupt lands
            Popen(["sh", "-c", "touch ran-" + str(launcher)], Policy(), workspace=ws,
                  start_new_session=True, preexec_fn=lambda: time.sleep(1.5))
            out[str(launcher)] = "returned"
        except KeyboardInterrupt:
            out[str(launcher)] = "interrupted"
    time.sleep(2)
    try:
        os.waitpid(-1, os.WNOHANG)
        out["children"] = "some left"
    except ChildProcessError:
        out["children"] = "none"
    print(json.dumps(out))
"""


@needs_sandbox
def test_an_interrupt_after_the_fork_leaves_no_process_behind(tmp_path: Path) -> None:
    """SIGTERM (KeyboardInterrupt in dsh) while Popen waits for the exec: the caller gets no
    handle, so Popen kills and reaps the child rather than leave the command running."""
    import json

    ws = tmp_path / "ws"
    ws.mkdir()
    proc = subprocess.run([sys.executable, "-c",
                           textwrap.dedent(INTERRUPTED.format(src=SRC)), str(ws)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == {"False": "interrupted", "True": "interrupted",
                                       "children": "none"}
    assert sorted(p.name for p in ws.iterdir()) == []  # no command ran
