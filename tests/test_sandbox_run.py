"""``dsh.sandbox.run`` and ``Popen``'s environment default: real child processes.

What a child gets of dsh's environment is read from the child itself (it prints
``os.environ`` as JSON); processes are found from outside by a marker in their argv
(tests/procs.py), never by a pid a confined child reports; no timing assertion: a stopped
program is told by ``Result.stopped`` and by its processes being gone.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from dsh import hookimpl
from dsh import sandbox
from dsh.host.runcontext import CancelToken
from dsh.sandbox.policy import Policy
from dsh.sandbox.spawn import Popen
from dsh.testing import ScriptedApp
from tests.procs import alive_with
from tests.procs import needs_sandbox

PRINT_ENV = "import json, os; print(json.dumps(dict(os.environ)))"
#: Keys dsh knows (its providers' ``default_key_env``s, dsh.run.app.PROVIDER_DEFAULTS), a
#: configured ``api_key_env``, and variables whose names say they hold a credential.
SECRETS = {"OPENAI_API_KEY": "sk-test-openai-0123456789",
           "ANTHROPIC_API_KEY": "sk-ant-test-0123456789",
           "MY_PROXY_API_KEY": "proxy-key-0123456789",
           "GITHUB_TOKEN": "ghp_test0123456789",
           "PGPASSWORD": "hunter2-hunter2",
           "DSH_TEST_VALUE": "dsh-own-variable",
           "LC_AUTH_TOKEN": "a-pattern-never-brings-this"}
POLICIES = [pytest.param(Policy(), id="confined", marks=needs_sandbox),
            pytest.param(Policy(mode="off"), id="off")]


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    path = tmp_path / "ws"
    path.mkdir()
    return path


@pytest.fixture
def secrets_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in SECRETS.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("LANG", "C.UTF-8")
    monkeypatch.setenv("LC_ALL", "C.UTF-8")


def gone(marker: str, within: float = 15.0) -> list[int]:
    """Poll until no process with ``marker`` is alive; return the survivors (killed)."""
    deadline = time.monotonic() + within
    while alive_with(marker) and time.monotonic() < deadline:
        time.sleep(0.05)
    survivors = alive_with(marker)
    for pid in survivors:
        os.kill(pid, 9)
    return survivors


def sleeper(marker: str, flag: str) -> str:
    """A shell word: Python that creates ``flag`` and sleeps 600 s, ``marker`` in its argv."""
    code = "import sys, time; open(sys.argv[1], 'w').close(); time.sleep(600)"
    return f"{sys.executable} -c \"{code}\" {flag} {marker}"


def tree(marker: str) -> list[str]:
    """A child (sh) that starts a grandchild in the background and one in the foreground."""
    return ["sh", "-c", f"{sleeper(marker, 'bg.flag')} & {sleeper(marker, 'fg.flag')}"]


# ------------------------------------------------------------------------------ environment


@pytest.mark.usefixtures("secrets_env")
@pytest.mark.parametrize("policy", POLICIES)
def test_popen_without_env_passes_no_key_to_the_child(ws: Path, policy: Policy) -> None:
    import subprocess

    proc = Popen([sys.executable, "-c", PRINT_ENV], policy, workspace=str(ws),
                 stdout=subprocess.PIPE)
    out, _ = proc.communicate(timeout=120)
    seen = json.loads(out)
    assert not set(SECRETS) & set(seen), sorted(set(SECRETS) & set(seen))
    assert not any(v in out.decode() for v in SECRETS.values())
    assert seen["PATH"] == os.environ["PATH"] and seen["LANG"] == "C.UTF-8"
    assert seen["LC_ALL"] == "C.UTF-8" and seen["PWD"] == str(ws)


@pytest.mark.usefixtures("secrets_env")
@pytest.mark.parametrize("policy", POLICIES)
def test_popen_with_an_empty_env_passes_an_empty_environment(ws: Path,
                                                            policy: Policy) -> None:
    import subprocess

    proc = Popen([sys.executable, "-c", PRINT_ENV], policy, workspace=str(ws), env={},
                 stdout=subprocess.PIPE)
    out, _ = proc.communicate(timeout=120)
    assert set(json.loads(out)) <= {"TMPDIR", "LC_CTYPE"}  # (python sets LC_CTYPE itself)


@pytest.mark.usefixtures("secrets_env")
@pytest.mark.parametrize("policy", POLICIES)
def test_run_passes_the_allowlist_and_only_the_keys_it_is_given(ws: Path,
                                                                policy: Policy) -> None:
    result = sandbox.run([sys.executable, "-c", PRINT_ENV], cwd=ws, timeout=120,
                         policy=policy)
    seen = json.loads(result.stdout)
    assert result.ok and not set(SECRETS) & set(seen)
    assert seen["HOME"] == os.environ["HOME"] and seen["PWD"] == str(ws)

    named = sandbox.run([sys.executable, "-c", PRINT_ENV], cwd=ws, timeout=120,
                        policy=policy, env={"OPENAI_API_KEY": "sk-given", "LANG": None})
    seen = json.loads(named.stdout)
    assert seen["OPENAI_API_KEY"] == "sk-given" and "LANG" not in seen
    assert not (set(SECRETS) - {"OPENAI_API_KEY"}) & set(seen)

    only = sandbox.run([sys.executable, "-c", PRINT_ENV], cwd=ws, timeout=120, policy=policy,
                       env={"ANTHROPIC_API_KEY": SECRETS["ANTHROPIC_API_KEY"]},
                       inherit_env=False)
    assert set(json.loads(only.stdout)) - {"TMPDIR", "LC_CTYPE"} == {"ANTHROPIC_API_KEY"}


def test_allowed_env_keeps_exact_names_and_filters_patterns(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GIT_AUTHOR_NAME", "a")
    monkeypatch.setenv("GIT_TOKEN", "t0123456789")
    monkeypatch.setenv("SERVICE_TOKEN", "s0123456789")
    env = sandbox.allowed_env("/x", keep=("GIT_*", "SERVICE_TOKEN"))
    assert env["GIT_AUTHOR_NAME"] == "a" and env["SERVICE_TOKEN"] == "s0123456789"
    assert "GIT_TOKEN" not in env and env["PWD"] == "/x"


# ------------------------------------------------------------------- stopping the process


@pytest.mark.parametrize("policy", POLICIES)
def test_a_timeout_kills_the_child_and_its_grandchild(ws: Path, policy: Policy) -> None:
    marker = f"dsh-test-run-{uuid.uuid4().hex}"
    result = sandbox.run(tree(marker), cwd=ws, timeout=10, policy=policy)
    assert result.timed_out and result.signal == 9 and not result.ok
    assert (ws / "bg.flag").exists() and (ws / "fg.flag").exists()  # both had started
    assert gone(marker) == []


@pytest.mark.parametrize("policy", POLICIES)
def test_a_background_child_does_not_outlive_the_program(ws: Path, policy: Policy) -> None:
    marker = f"dsh-test-run-{uuid.uuid4().hex}"
    code = f"{sleeper(marker, 'bg.flag')} & while [ ! -e bg.flag ]; do sleep 0.05; done; echo up"
    result = sandbox.run(["sh", "-c", code], cwd=ws, timeout=120, policy=policy)
    assert (result.stopped, result.exit_code, result.stdout) == (None, 0, "up\n")
    assert gone(marker) == []


@pytest.mark.parametrize("policy", POLICIES)
def test_cancelling_ends_the_run_early_and_kills_the_tree(ws: Path, policy: Policy) -> None:
    marker = f"dsh-test-run-{uuid.uuid4().hex}"
    token = CancelToken()
    box: list[Any] = []
    worker = threading.Thread(target=lambda: box.append(sandbox.run(
        tree(marker), cwd=ws, timeout=600, policy=policy, cancel=token)))
    worker.start()
    deadline = time.monotonic() + 120
    while not (ws / "fg.flag").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert (ws / "fg.flag").exists()
    token.cancel("test")
    worker.join(120)
    assert not worker.is_alive()
    [result] = box
    assert result.aborted and result.returncode is not None and not result.ok
    assert gone(marker) == []


def test_a_cancelled_token_starts_nothing(ws: Path) -> None:
    token = CancelToken()
    token.cancel("before")
    result = sandbox.run(["touch", "ran"], cwd=ws, timeout=60, policy=Policy(mode="off"),
                         cancel=token)
    assert (result.aborted, result.returncode, result.sandbox) == (True, None, {})
    assert not (ws / "ran").exists()


# --------------------------------------------------------------------------------- output


@pytest.mark.parametrize("policy", POLICIES)
def test_a_flooding_child_is_stopped_and_its_output_bounded(ws: Path, policy: Policy) -> None:
    code = "import sys\nwhile True: sys.stdout.write('x' * 65536); sys.stderr.write('e' * 999)"
    result = sandbox.run([sys.executable, "-c", code], cwd=ws, timeout=300, policy=policy,
                         max_output=1000, output_limit=4 << 20)
    assert result.stopped == "output" and result.cut
    assert result.stdout_size > 1 << 20
    assert len(result.stdout) < 1100 and len(result.stderr) < 1100
    assert result.stdout.startswith("x" * 750) and result.stdout.endswith("x" * 250)
    assert "bytes cut …]" in result.stdout


@pytest.mark.parametrize("policy", POLICIES)
def test_both_streams_are_drained_and_keep_their_head_and_tail(ws: Path,
                                                              policy: Policy) -> None:
    code = ("import sys\nsys.stderr.write('E' * (3 << 20) + 'END-ERR')\n"
            "sys.stdout.write('BEGIN' + 'é' * (2 << 20) + 'END-OUT')")
    result = sandbox.run([sys.executable, "-c", code], cwd=ws, timeout=300, policy=policy,
                         max_output=4096)
    assert (result.stopped, result.exit_code, result.cut) == (None, 0, True)
    assert result.stderr_size == (3 << 20) + 7 and result.stdout_size == 5 + (4 << 20) + 7
    assert result.stdout.startswith("BEGINéé") and result.stdout.endswith("éé" + "END-OUT")
    assert "\ufffd" not in result.stdout  # cut on character boundaries
    assert result.stderr.endswith("E" * 100 + "END-ERR")
    raw = sandbox.run(["printf", "a\\0b"], cwd=ws, timeout=60, policy=policy, text=False)
    assert raw.stdout == b"a\0b" and not raw.cut


def test_stdin_is_written_to_the_program(ws: Path) -> None:
    data = os.urandom(1 << 20)
    result = sandbox.run(["wc", "-c"], cwd=ws, timeout=120, policy=Policy(mode="off"),
                         stdin=data)
    assert result.stdout.strip() == str(len(data))


def test_outside_a_run_a_policy_is_required(ws: Path) -> None:
    from dsh.core.errors import UsageError

    with pytest.raises(UsageError, match="pass policy="):
        sandbox.run(["true"], cwd=ws, timeout=60)


# ---------------------------------------------------------------------- inside a tool call


class Prober:
    """A plugin whose tool runs a program through ``sandbox.run`` (the agent's policy)."""

    def __init__(self, ws: Path, argv: list[str], before: Callable[[], None] | None = None):
        self.ws, self.argv, self.before = ws, argv, before
        self.results: list[Any] = []

    @hookimpl
    def register_tools(self, register: Callable[..., None]) -> None:
        def probe() -> str:
            """Run the probe."""
            if self.before is not None:
                self.before()
            result = sandbox.run(self.argv, cwd=self.ws, timeout=600)
            self.results.append(result)
            return f"{result.exit_code} {result.stdout.strip()}"

        register(probe)


def test_inside_a_tool_call_it_runs_under_the_agents_policy_and_records_the_call(
        ws: Path, dsh_make_app: Callable[..., ScriptedApp]) -> None:
    prober = Prober(ws, ["sh", "-c", "echo hello; touch written"])
    app = dsh_make_app({"autoload": False, "sandbox": {"policy": "off"}},
                       plugins={"prober": prober})
    app.script.tool_call("probe").text("done")
    result = app.run("go")
    assert result.output == "done"
    [called] = [e for e in result.event_dicts if e["type"] == "tool/call"]
    [record] = [e["data"] for e in result.event_dicts if e["type"] == "x/prober/sandbox"]
    assert record["call_id"] == called["call_id"] == "call_0_0" and record["tool"] == "probe"
    assert record["policy"] == "off" and record["backend"] == "none"
    assert prober.results[0].recorded == "x/prober/sandbox"
    assert prober.results[0].stdout == "hello\n" and (ws / "written").exists()


@needs_sandbox
def test_a_read_only_agent_policy_confines_the_tools_program(
        ws: Path, dsh_make_app: Callable[..., ScriptedApp]) -> None:
    prober = Prober(ws, ["sh", "-c", "touch written; echo $?"])
    app = dsh_make_app({"autoload": False, "sandbox": {"policy": "read-only"}},
                       plugins={"prober": prober})
    app.script.tool_call("probe").text("done")
    result = app.run("go")
    [record] = [e["data"] for e in result.event_dicts if e["type"] == "x/prober/sandbox"]
    assert record["policy"] == "read-only" and record["backend"] == "landlock"
    assert not (ws / "written").exists() and prober.results[0].stdout.strip() != "0"


def test_aborting_the_run_kills_the_tools_program(
        ws: Path, dsh_make_app: Callable[..., ScriptedApp]) -> None:
    from dsh.host.runcontext import context

    marker = f"dsh-test-run-{uuid.uuid4().hex}"

    def abort_once_started() -> None:
        ctx = context()

        def watch() -> None:
            deadline = time.monotonic() + 120
            while not (ws / "fg.flag").exists() and time.monotonic() < deadline:
                time.sleep(0.05)
            ctx.abort("test abort")

        threading.Thread(target=watch, daemon=True).start()

    prober = Prober(ws, tree(marker), before=abort_once_started)
    app = dsh_make_app({"autoload": False, "sandbox": {"policy": "off"}},
                       plugins={"prober": prober})
    app.script.tool_call("probe").text("done")
    app.run("go")
    [ran] = prober.results
    assert ran.aborted and (ws / "fg.flag").exists()
    assert gone(marker) == []
