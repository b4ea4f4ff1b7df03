"""dsh-shell's background jobs: ``run_command(background=true)``, ``job_output``, ``job_kill``.

Real processes under the real sandbox: a loopback HTTP server (under a policy with network;
the default policy has none, and its bind is refused), a job that writes a file, a flood of
output, a job that forks and escapes its group, and ``dsh run`` itself — ending normally, on
SIGTERM, and killed outright — with nothing of a job left afterwards. Processes are found
from outside by a marker in their argv (a confined job has its own PID namespace: the pids it
would report are not ours), and their end is polled for, never timed.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dsh.core.errors import ToolError
from dsh.host.runcontext import RunContext
from dsh.host.runcontext import activate
from dsh.ledger.writer import Ledger
from dsh.run.app import App
from tests.procs import alive_with
from tests.procs import needs_namespaces
from tests.procs import needs_sandbox
from tests.workbench import shell_apps

dsh_shell = pytest.importorskip("dsh_shell", reason="pip install ./plugins/dsh-shell")
from dsh_shell import jobs  # noqa: E402

pytestmark = needs_sandbox


@pytest.fixture(autouse=True)
def _discovery(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.delenv("DSH_LOAD_PLUGINS", raising=False)
    yield
    jobs.kill_all()  # jobs a test started outside any run


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    root = tmp_path / "ws"
    root.mkdir()
    (root / "x.txt").write_text("hello from x\n")
    return root


@pytest.fixture
def make(tmp_path: Path, ws: Path) -> Callable[..., App]:
    """``make(sandbox=…, **shell_settings)``: agent ``a`` with the shell tools."""
    return shell_apps(tmp_path, ws)


class Tools:
    def __init__(self, app: App) -> None:
        self.tools = app.agent("a").tools

    def start(self, command: str) -> tuple[int, int]:
        text = self.tools["run_command"].fn(command=command, background=True)
        found = re.match(r"started job (\d+) \(pid (\d+)\)", text)
        assert found, text
        return int(found.group(1)), int(found.group(2))

    def output(self, job: int) -> str:
        return self.tools["job_output"].fn(job_id=job)

    def kill(self, job: int) -> str:
        return self.tools["job_kill"].fn(job_id=job)

    def until(self, job: int, wanted: str, timeout: float = 30) -> str:
        """job_output, called until what it returned (all of it) holds ``wanted``."""
        seen = ""
        deadline = time.monotonic() + timeout
        while wanted not in seen and time.monotonic() < deadline:
            seen += self.output(job) + "\n"
            if wanted not in seen:
                time.sleep(0.05)
        assert wanted in seen, seen
        return seen


@contextlib.contextmanager
def a_run(**options: Any) -> Iterator[RunContext]:
    """A run (approving every call, as ``--yes``); its cleanups run when it ends."""
    ctx = RunContext(run_id="r", agent="a", ledger=Ledger("s"), approve_all=True, **options)
    with activate(ctx):
        try:
            yield ctx
        finally:
            assert ctx.run_cleanups() == []


def group(pgid: int) -> list[int]:
    """Live processes (not zombies) in process group ``pgid``."""
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            fields = Path(f"/proc/{entry.name}/stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            found.append(int(entry.name))
    return found


def gone(test: Callable[[], list[int]], within: float = 10.0) -> list[int]:
    """Poll until ``test()`` finds no process; return the survivors (and kill them)."""
    deadline = time.monotonic() + within
    while test() and time.monotonic() < deadline:
        time.sleep(0.05)
    survivors = test()
    for pid in survivors:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    return survivors


def sleeper(marker: str, flag: str) -> str:
    """A shell word: Python marking ``flag`` (a file) and sleeping, ``marker`` in its argv."""
    code = "import sys, time; open(sys.argv[1], 'w').close(); time.sleep(600)"
    return f"{sys.executable} -c \"{code}\" {flag} {marker}"


def rss_kib() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


# --------------------------------------------------------------------------------------------
# A server, a writer, a flood, a fork
# --------------------------------------------------------------------------------------------


def test_a_loopback_http_server_runs_as_a_job_and_is_killed(make: Callable[..., App],
                                                            ws: Path) -> None:
    """Under a policy with network (leaving the sandbox: approved, as with --yes)."""
    tools = Tools(make(sandbox={"network": True}))
    with a_run():
        job, pid = tools.start(f"{sys.executable} -u -m http.server --bind 127.0.0.1 0")
        seen = tools.until(job, "Serving HTTP on 127.0.0.1 port ")
        assert f"job {job}: running\n--- new output ---\nServing HTTP" in seen
        port = int(re.search(r"port (\d+)", seen).group(1))  # type: ignore[union-attr]
        direct = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        with direct.open(f"http://127.0.0.1:{port}/x.txt", timeout=30) as response:
            assert response.read() == b"hello from x\n"
        tools.until(job, '"GET /x.txt HTTP/1.1" 200')
        assert tools.output(job) == f"job {job}: running\n(no new output)"
        assert group(pid), "the job's process group is running"
        assert tools.kill(job) == f"killed job {job} (pid {pid}) with its process group"
        assert gone(lambda: group(pid)) == []
        with pytest.raises(urllib.error.URLError):
            direct.open(f"http://127.0.0.1:{port}/x.txt", timeout=5)
        assert tools.output(job) == f"job {job}: killed (job_kill)\n(no new output)"
        assert tools.kill(job) == f"job {job} had ended already: killed (job_kill)"


def test_the_default_policy_has_no_network_so_the_server_cannot_bind(
        make: Callable[..., App]) -> None:
    tools = Tools(make())
    with a_run():
        job, _ = tools.start(f"{sys.executable} -u -m http.server --bind 127.0.0.1 0")
        seen = tools.until(job, f"job {job}: exited with code 1")
        # seccomp refuses the socket (EAFNOSUPPORT); Landlock would refuse the bind
        assert re.search(r"(OSError|PermissionError): \[Errno \d+\]", seen), seen


def test_a_job_that_writes_a_file_stops_when_killed(make: Callable[..., App], ws: Path) -> None:
    tools = Tools(make())
    log = ws / "log.txt"
    with a_run():
        job, pid = tools.start("while :; do echo tick >> log.txt; sleep 0.05; done")
        deadline = time.monotonic() + 30
        while (not log.exists() or log.read_text().count("tick") < 3) and \
                time.monotonic() < deadline:
            time.sleep(0.05)
        assert log.read_text().count("tick") >= 3  # it runs, and writes in the workspace
        assert tools.kill(job).startswith(f"killed job {job} (pid {pid})")
        assert gone(lambda: group(pid)) == []
        size = log.stat().st_size
        time.sleep(0.3)
        assert log.stat().st_size == size  # nothing of it is left to write


def test_a_flood_of_output_is_bounded_and_never_blocks_the_job(make: Callable[..., App]) -> None:
    tools = Tools(make(max_output=2000))
    before = rss_kib()
    with a_run() as ctx:
        job, pid = tools.start("yes")
        table = ctx.data[jobs.KEY]
        deadline = time.monotonic() + 60
        while table.jobs[job].ring.total < 32 * jobs.RING and time.monotonic() < deadline:
            time.sleep(0.05)
        ring = table.jobs[job].ring
        assert ring.total >= 32 * jobs.RING  # read as fast as it comes: the pipe never fills
        assert len(ring.buf) == jobs.RING
        out = tools.output(job)
        assert out.startswith(f"job {job}: running\n[… ")
        assert f"bytes of output were dropped before this read: a job keeps only its last " \
               f"{jobs.RING} bytes …]\n--- new output (cut: {jobs.RING} bytes, showing the " \
               f"first 1500 and the last 500) ---\ny\ny\n" in out
        assert len(out.encode()) < 2000 + 400
        assert rss_kib() - before < 64 * 1024  # the ring, not the flood
        assert tools.kill(job).startswith(f"killed job {job}")
        assert gone(lambda: group(pid)) == []


@needs_namespaces
def test_a_job_that_forks_is_killed_entirely(make: Callable[..., App], ws: Path) -> None:
    """Children in the background, a subshell's, one in its own session (setsid) and one
    ignoring SIGTERM: the job's PID namespace goes with it."""
    marker = f"dsh-test-{uuid.uuid4().hex}"
    tools = Tools(make())
    line = textwrap.dedent(f"""
        ({sleeper(marker, 'f1')} &)
        setsid {sleeper(marker, 'f2')} &
        (trap '' TERM HUP; exec {sleeper(marker, 'f3')}) &
        {sleeper(marker, 'f4')}
    """)
    with a_run():
        job, pid = tools.start(line)
        deadline = time.monotonic() + 60
        while len(list(ws.glob("f?"))) < 4 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(alive_with(marker)) >= 4
        assert tools.kill(job).startswith(f"killed job {job} (pid {pid})")
        assert gone(lambda: alive_with(marker)) == []
        assert gone(lambda: group(pid)) == []
        assert tools.output(job).startswith(f"job {job}: killed (job_kill)")


# --------------------------------------------------------------------------------------------
# Limits, errors, approval
# --------------------------------------------------------------------------------------------


def test_max_jobs_limits_the_running_jobs(make: Callable[..., App]) -> None:
    marker = f"dsh-test-{uuid.uuid4().hex}"
    tools = Tools(make(max_jobs=2))
    with a_run():
        first, _ = tools.start(f"sleep 600 # {marker}")
        tools.start(f"sleep 600 # {marker}")
        with pytest.raises(ToolError, match=r"2 background jobs are running, the most a run "
                                            r"may have \(max_jobs = 2\): stop one with job_kill"):
            tools.start("sleep 600")
        tools.kill(first)
        third, _ = tools.start(f"sleep 600 # {marker}")
        assert third == 3
    # the run ended: its jobs were killed (bash, whose argv holds the marker, with them)
    assert gone(lambda: alive_with(marker)) == []


def test_job_output_of_a_job_that_exits(make: Callable[..., App]) -> None:
    tools = Tools(make())
    with a_run():
        job, _ = tools.start("echo out; echo err >&2; exit 3")
        seen = tools.until(job, "exited with code 3")
        # stdout and stderr share one pipe, in the order written; a read may fall between
        # the two lines, so they may come in one read or two, never out of order
        printed = [line for line in seen.splitlines()
                   if not line.startswith(("job ", "--- new output", "(no new output)"))]
        assert printed == ["out", "err"], seen
        assert tools.output(job) == f"job {job}: exited with code 3\n(no new output)"


def test_unknown_jobs_are_errors(make: Callable[..., App]) -> None:
    tools = Tools(make())
    with a_run():
        with pytest.raises(ToolError, match="there is no job 1: this run has started none"):
            tools.output(1)
        job, _ = tools.start("sleep 600")
        with pytest.raises(ToolError, match=rf"there is no job 7 \(jobs of this run: {job}\)"):
            tools.kill(7)


def test_a_job_is_approved_like_any_command(make: Callable[..., App], ws: Path) -> None:
    """In mode ask without a terminal, a job that needs approval is refused and never
    starts; an allowlisted one starts at once."""
    tools = Tools(make(allow=["sleep"]))
    ctx = RunContext(run_id="r", agent="a", ledger=Ledger("s"))  # no --yes
    with activate(ctx):
        try:
            with pytest.raises(ToolError, match="needs approval: touch is not on the "
                                                "allowlist.*there is no terminal"):
                tools.start("touch made && sleep 600")
            job, pid = tools.start("sleep 600")
            assert group(pid)
        finally:
            assert ctx.run_cleanups() == []
    assert not (ws / "made").exists()
    assert gone(lambda: group(pid)) == []


def test_the_start_is_recorded(make: Callable[..., App], script: Callable[..., str],
                               ws: Path) -> None:
    app = make(allow=["sleep", "echo"])
    model = script(
        {"tool_calls": [{"name": "run_command",
                         "arguments": {"command": "sleep 600", "background": True}}]},
        {"tool_calls": [{"name": "job_kill", "arguments": {"job_id": 1}}]},
        {"text": "done"})
    run = app.run("go", agent="a", model=model)
    events = list(app.store.read(run.session_id))
    outputs = [e.output for e in events if getattr(e, "type", "") == "tool/result"]
    assert outputs[0].startswith("started job 1 (pid ")
    assert outputs[1].startswith("killed job 1 (pid ")
    recorded = [dict(e.data) for e in events if getattr(e, "tag", "") == "x/shell/job"]
    assert [(r["job"], r["event"]) for r in recorded] == [(1, "started"), (1, "killed")]
    assert recorded[0]["command"] == "sleep 600" and recorded[0]["call_id"]
    assert any(getattr(e, "tag", "") == "x/shell/sandbox" for e in events)


# --------------------------------------------------------------------------------------------
# The run's end
# --------------------------------------------------------------------------------------------


@pytest.fixture(params=["namespaces", "landlock-only"])
def confinement(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """With the job's own namespaces (where this machine makes them), and without: the
    fallback where killing the process group is all there is."""
    if request.param == "namespaces":
        from tests.procs import CHECK

        if CHECK.get("namespaces") != "ok":
            pytest.skip(f"no user namespaces on this machine: {CHECK.get('namespaces')}")
    else:
        import dsh.sandbox.spawn

        monkeypatch.setattr(dsh.sandbox.spawn, "_namespaces_unavailable",
                            lambda: "turned off by a test")
    return str(request.param)


def test_the_end_of_the_run_kills_its_jobs(make: Callable[..., App], ws: Path,
                                           confinement: str) -> None:
    marker = f"dsh-test-{uuid.uuid4().hex}"
    tools = Tools(make())
    with a_run():
        tools.start(f"{sleeper(marker, 'f1')} & {sleeper(marker, 'f2')}")
        deadline = time.monotonic() + 60
        while len(alive_with(marker)) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(alive_with(marker)) >= 2
    assert gone(lambda: alive_with(marker)) == []


def test_what_an_ended_job_left_in_its_group_is_killed_with_the_run(
        make: Callable[..., App], ws: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Without namespaces a job's shell may exit and leave a child running in its group
    (with namespaces the child goes with the shell): the run's end kills the group."""
    import dsh.sandbox.spawn

    monkeypatch.setattr(dsh.sandbox.spawn, "_namespaces_unavailable",
                        lambda: "turned off by a test")
    marker = f"dsh-test-{uuid.uuid4().hex}"
    tools = Tools(make())
    with a_run():
        job, pid = tools.start(f"{sleeper(marker, 'f1')} > /dev/null 2>&1 &")
        tools.until(job, f"job {job}: exited with code 0")
        deadline = time.monotonic() + 60
        while not (ws / "f1").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert alive_with(marker) and group(pid)  # the child outlived the job's shell
    assert gone(lambda: alive_with(marker)) == []


def test_jobs_started_outside_a_run_die_with_the_interpreter(ws: Path) -> None:
    mark = f"600.{os.getpid()}{time.monotonic_ns() % 10**6}"  # a duration no other sleep has
    code = textwrap.dedent(f"""
        from dsh_shell import commands, jobs
        from dsh_shell.settings import parse_settings
        settings = parse_settings({{"workspace": {str(ws)!r}, "allow": ["sleep"]}})
        print(commands.run_command(settings, "sleep {mark}", background=True))
        print(jobs.output(1, 1000))
    """)
    env = {k: v for k, v in os.environ.items() if k != "DSH_LOAD_PLUGINS"}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, env=env, start_new_session=True)
    assert proc.returncode == 0, proc.stderr
    assert re.match(r"started job 1 \(pid \d+\).*\njob 1: running\n", proc.stdout), proc.stdout
    assert gone(lambda: alive_with(f"sleep\0{mark}")) == []


def _dsh_run(tmp_path: Path, ws: Path, model: str) -> subprocess.Popen[str]:
    config = tmp_path / "dsh.toml"
    config.write_text(textwrap.dedent(f"""
        sessions_dir = {json.dumps(str(tmp_path / "sessions"))}
        [plugins.shell]
        workspace = {json.dumps(str(ws))}
        [agents.a]
        plugins = ["shell"]
    """))
    env = {k: v for k, v in os.environ.items() if k not in ("DSH_LOAD_PLUGINS", "DSH_CONFIG")}
    return subprocess.Popen(
        [sys.executable, "-m", "dsh", "--config", str(config), "run", "-a", "a", "-m", model,
         "--json", "--yes", "start the server"],
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env=env, start_new_session=True)


def _model(script: Callable[..., str], marker: str, then: str) -> str:
    job = f"{sleeper(marker, 'started')} & {sleeper(marker, 'child')}"
    return script(
        {"tool_calls": [{"name": "run_command",
                         "arguments": {"command": job, "background": True}}]},
        {"tool_calls": [{"name": "run_command", "arguments": {
            "command": f"while [ ! -e started ] || [ ! -e child ]; do sleep 0.05; done; {then}"}}]},
        {"text": "done"})


def test_dsh_run_leaves_no_job_behind(ws: Path, tmp_path: Path,
                                      script: Callable[..., str]) -> None:
    marker = f"dsh-test-{uuid.uuid4().hex}"
    dsh = _dsh_run(tmp_path, ws, _model(script, marker, "echo both-started"))
    out, err = dsh.communicate(timeout=120)
    assert dsh.returncode == 0, err
    summary = json.loads(out)
    assert (summary["outcome"], summary["output"]) == ("completed", "done")
    lines = [json.loads(line) for line in Path(summary["path"]).read_text().splitlines()]
    results = [e["output"] for e in lines if e["type"] == "tool/result"]
    assert results[0].startswith("started job 1 (pid ")
    assert results[1] == "exit code: 0\n--- stdout ---\nboth-started"
    assert [e["data"]["event"] for e in lines if e["type"] == "x/shell/job"] == ["started"]
    assert (ws / "started").exists() and (ws / "child").exists()
    assert gone(lambda: alive_with(marker)) == []


@pytest.mark.parametrize("sig", [
    signal.SIGTERM,
    pytest.param(signal.SIGKILL, marks=needs_namespaces),  # the relay ends the namespace
], ids=["SIGTERM", "SIGKILL"])
def test_dsh_run_ended_by_a_signal_leaves_no_job_behind(
        ws: Path, tmp_path: Path, script: Callable[..., str], sig: signal.Signals) -> None:
    marker = f"dsh-test-{uuid.uuid4().hex}"
    dsh = _dsh_run(tmp_path, ws, _model(script, marker, "touch seen; sleep 600"))
    try:
        deadline = time.monotonic() + 60
        while not (ws / "seen").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert (ws / "seen").exists(), dsh.stderr.read() if dsh.poll() is not None else ""
        assert len(alive_with(marker)) >= 2
        dsh.send_signal(sig)
        dsh.communicate(timeout=60)
    finally:
        if dsh.poll() is None:
            dsh.kill()
            dsh.communicate()
    assert dsh.returncode in (143, -signal.SIGKILL, 130), dsh.returncode
    assert gone(lambda: alive_with(marker)) == []
