"""plugins/dsh-ray (issue 16): ``dsh batch --executor ray`` on a real local Ray cluster.

The plugin is installed for real (non-editable) and loaded through its entry point. One Ray
cluster is started for the module (``ray.init`` costs 9-16 s here) in a helper process;
each ``dsh batch`` is a real subprocess that joins it through ``RAY_ADDRESS``, as a user's
driver joins a cluster. The model is ``scripted:FILE``; the tools the workers run come from
a small plugin module shipped to them with ``[plugins.dsh-ray] runtime_env``.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from typing import ClassVar

import attrs
import pytest
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st

from dsh.host.runcontext import Budget
from dsh.host.runcontext import Limits

if importlib.util.find_spec("ray") is None or importlib.util.find_spec("dsh_ray") is None:
    pytest.skip("ray or dsh-ray is not installed (pip install 'ray>=2.40' ./plugins/dsh-ray)",
                allow_module_level=True)

ROOT = Path(__file__).resolve().parent.parent

CLUSTER = """
import sys, ray
ray.init(num_cpus=2, include_dashboard=False, logging_level="ERROR", log_to_driver=False)
print(ray.get_runtime_context().gcs_address, flush=True)
sys.stdin.read()  # until the test module closes it
ray.shutdown()
"""

TOOLS = '''
"""Tools the Ray workers run in tests/test_ray_plugin.py."""
import os
import signal
import time

import dsh


def whoami() -> str:
    """The id of the process running this tool."""
    return str(os.getpid())


def die(marker: str = "", wait: float = 0.0) -> str:
    """SIGKILL this process (after ``wait`` seconds): every time, or (with ``marker``) the
    first time only."""
    if not marker or not os.path.exists(marker):
        if marker:
            open(marker, "w").close()
        time.sleep(wait)
        os.kill(os.getpid(), signal.SIGKILL)
    return "survived"


def block(seconds: float) -> str:
    """Sleep, deaf to the run's abort (a tool that does not check its cancel token)."""
    time.sleep(seconds)
    return "woke"


@dsh.hookimpl
def register_tools(register):
    register(whoami)
    register(die)
    register(block)
'''


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """A local Ray cluster for the module: its address and the environment to join it."""
    env = {**os.environ}
    env.pop("RAY_ADDRESS", None)
    where = tmp_path_factory.mktemp("ray")
    log = (where / "cluster.log").open("w")
    proc = subprocess.Popen([sys.executable, "-c", CLUSTER], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=log, text=True, env=env, cwd=where)
    assert proc.stdout is not None and proc.stdin is not None
    address = proc.stdout.readline().strip()
    if not address:
        proc.kill()
        proc.wait()
        proc.stdout.close()
        proc.stdin.close()
        log.close()
        pytest.fail(f"the Ray cluster did not start: {(where / 'cluster.log').read_text()}")
    tools = tmp_path_factory.mktemp("tools")
    (tools / "ray_test_tools.py").write_text(TOOLS)
    # A new local Ray enables token authentication (the token in ~/.ray/auth_token): a driver
    # joining it by address says so with RAY_AUTH_MODE (docs/ray.md).
    yield {"RAY_ADDRESS": address, "RAY_AUTH_MODE": "token", "tools": str(tools)}
    proc.stdin.close()
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    proc.stdout.close()
    log.close()


@pytest.fixture
def env(tmp_path: Path, cluster: dict[str, str]) -> dict[str, Any]:
    """Sessions under tmp_path, installed plugins autoloaded (dsh-ray by its entry point),
    the test tools loaded in the driver and shipped to the workers."""
    config = tmp_path / "config.toml"
    runtime_env = f"{{ env_vars = {{ PYTHONPATH = {json.dumps(cluster['tools'])} }} }}"
    config.write_text(f'sessions_dir = "{tmp_path / "sessions"}"\n'
                      'load = ["ray_test_tools"]\n'
                      "[plugins.dsh-ray]\n"
                      "task_cpus = 0.25\n"
                      f"runtime_env = {runtime_env}\n")
    environ = {**os.environ, "DSH_HOME": str(tmp_path / "home"), "DSH_CONFIG": str(config),
               "XDG_CONFIG_HOME": str(tmp_path / "xdg"), "PYTHONPATH": cluster["tools"],
               "RAY_ADDRESS": cluster["RAY_ADDRESS"], "RAY_AUTH_MODE": cluster["RAY_AUTH_MODE"]}
    environ.pop("OPENAI_API_KEY", None)
    environ.pop("ANTHROPIC_API_KEY", None)
    return {"dir": tmp_path, "env": environ, "sessions": tmp_path / "sessions",
            "config": config}


def model(tmp_path: Path, *responses: dict[str, Any], name: str = "script") -> str:
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps({"responses": list(responses)}))
    return f"scripted:{path}"


def write_tasks(path: Path, n: int, **extra: Any) -> Path:
    path.write_text("".join(json.dumps({"id": f"t{i}", "prompt": f"task {i}", **extra}) + "\n"
                            for i in range(n)))
    return path


def batch(env: dict[str, Any], *args: str,
          timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "dsh", "batch", *args], env=env["env"],
                          cwd=env["dir"], capture_output=True, text=True, timeout=timeout)


def lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def ledger(path: Path | str) -> list[dict[str, Any]]:
    return lines(Path(path))


def all_events(sessions: Path) -> list[dict[str, Any]]:
    return [e for p in sorted(sessions.glob("*.jsonl")) for e in ledger(p)]


def closed_as_interrupted(events: list[dict[str, Any]]) -> bool:
    """The ledger ends as dsh closes any crashed session's (dsh.ledger, on open)."""
    end = events[-1]
    return (end["type"] == "turn/end" and end["outcome"] == "aborted"
            and end["reason"].startswith("interrupted: the process ended during this turn"))


# ------------------------------------------------------------------------------------------
# Installation and imports
# ------------------------------------------------------------------------------------------


def test_installed_for_real_and_found_by_its_entry_point() -> None:
    eps = [ep for ep in importlib.metadata.entry_points(group="dsh") if ep.name == "ray"]
    assert [ep.value for ep in eps] == ["dsh_ray"]
    spec = importlib.util.find_spec("dsh_ray")
    assert spec is not None and spec.origin is not None
    # Non-editable, as CI installs it: the module is the installed copy, not the source tree.
    assert not Path(spec.origin).resolve().is_relative_to(ROOT / "plugins"), spec.origin
    assert importlib.metadata.version("dsh-ray") == "0.1.0"


def test_installed_copy_is_not_stale() -> None:
    """The tests exercise the installed copy; make sure it is the code in this checkout."""
    import dsh_ray

    installed = Path(dsh_ray.__file__).parent
    for src in sorted((ROOT / "plugins" / "dsh-ray" / "dsh_ray").glob("*.py")):
        copy = installed / src.name
        assert copy.exists() and copy.read_bytes() == src.read_bytes(), (
            f"installed dsh-ray ({installed}) differs from {src}: reinstall it with "
            f"`{sys.executable} -m pip install --no-deps {ROOT / 'plugins' / 'dsh-ray'}`")


IMPORTS = """
import json, sys
from dsh.cli.root import main
sys.argv = ["dsh", *json.loads(sys.argv[1])]
try:
    main()
except SystemExit as exc:
    code = exc.code
print(json.dumps({"code": code, "ray": "ray" in sys.modules,
                  "executor": "dsh_ray.executor" in sys.modules,
                  "plugin": "dsh_ray" in sys.modules}), file=sys.stderr)
"""


def _imports(env: dict[str, Any], *args: str) -> dict[str, Any]:
    proc = subprocess.run([sys.executable, "-c", IMPORTS, json.dumps(args)], env=env["env"],
                          cwd=env["dir"], capture_output=True, text=True, timeout=60)
    return json.loads(proc.stderr.strip().splitlines()[-1])


def test_help_and_a_local_batch_never_import_ray(env: dict[str, Any]) -> None:
    seen = _imports(env, "--help")
    assert seen == {"code": 0, "ray": False, "executor": False, "plugin": False}
    m = model(env["dir"], {"text": "ok"})
    write_tasks(env["dir"] / "tasks.jsonl", 3)
    seen = _imports(env, "batch", "tasks.jsonl", "-m", m, "--results", "r.jsonl")
    # The plugin is loaded (autoload): its executor module and ray are not.
    assert seen == {"code": 0, "ray": False, "executor": False, "plugin": True}
    assert len(lines(env["dir"] / "r.jsonl")) == 3


def test_without_ray_the_executor_says_how_to_install_it(env: dict[str, Any]) -> None:
    code = ("import sys\nsys.modules['ray'] = None  # as if not installed\n"
            "from dsh.cli.root import main\nsys.argv = ['dsh', *sys.argv[1:]]\nmain()\n")
    write_tasks(env["dir"] / "tasks.jsonl", 2)
    proc = subprocess.run([sys.executable, "-c", code, "batch", "tasks.jsonl", "-m", "echo",
                           "--executor", "ray"], env=env["env"], cwd=env["dir"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip() == (
        "dsh: error: --executor ray: the ray package is not installed in dsh's environment "
        "(pip install 'ray>=2.40,<3')")


@pytest.mark.parametrize(("setting", "message"), [
    ("task_cpus = -1", "[plugins.dsh-ray] task_cpus: must be a positive number"),
    ('adress = "x"', "[plugins.dsh-ray]: unknown key 'adress'"),
    ("runtime_env = 3", "[plugins.dsh-ray] runtime_env: must be a table"),
])
def test_bad_settings_are_one_line_naming_the_key(env: dict[str, Any], setting: str,
                                                  message: str) -> None:
    env["config"].write_text(f'sessions_dir = "{env["sessions"]}"\n[plugins.dsh-ray]\n'
                             f"{setting}\n")
    m = model(env["dir"], {"text": "ok"})
    write_tasks(env["dir"] / "tasks.jsonl", 2)
    proc = batch(env, "tasks.jsonl", "-m", m, "--executor", "ray")
    assert proc.returncode == 2, proc.stderr
    assert message in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert proc.stdout == ""


# ------------------------------------------------------------------------------------------
# Settings and the remote budget level (in-process, without ray)
# ------------------------------------------------------------------------------------------

_SETTING_VALUES = st.one_of(st.none(), st.booleans(), st.integers(-3, 8),
                            st.floats(-1, 8, allow_nan=False), st.text(max_size=5),
                            st.dictionaries(st.sampled_from(["pip", "env_vars"]),
                                            st.just(["x"]), max_size=2))


@given(st.dictionaries(st.sampled_from(["address", "num_cpus", "task_cpus", "runtime_env",
                                        "namespace", "adress", "cpus"]),
                       _SETTING_VALUES, max_size=5))
@settings(max_examples=300, deadline=None)
def test_settings_accept_exactly_the_valid_tables(raw: dict[str, Any]) -> None:
    from dsh_ray.settings import settings_from

    from dsh.core.errors import ConfigError

    def ok(key: str, value: Any) -> bool:
        if value is None:
            return key in ("address", "namespace", "num_cpus", "task_cpus", "runtime_env")
        if key in ("address", "namespace"):
            return isinstance(value, str)
        if key in ("num_cpus", "task_cpus"):
            number = isinstance(value, (int, float)) and not isinstance(value, bool)
            return number and value >= 0 and (key == "task_cpus" or value > 0)
        return key == "runtime_env" and isinstance(value, dict)

    valid = all(ok(k, v) for k, v in raw.items())
    if valid:
        got = settings_from(raw)
        cpus = raw.get("task_cpus")
        assert got.task_cpus == (1.0 if cpus is None else float(cpus))
        assert got.num_cpus == raw.get("num_cpus")
        assert got.address == (raw.get("address") or None)
    else:
        with pytest.raises(ConfigError) as info:
            settings_from(raw)
        bad = [k for k, v in raw.items() if not ok(k, v)]
        assert any(k in str(info.value) for k in bad), (info.value, bad)
        assert str(info.value).startswith("[plugins.dsh-ray]")


@attrs.define(eq=False)
class _ElsewhereBudget(Budget):
    """A level with ``remote = True`` whose counters live in another object, as dsh-ray's
    live in an actor (dsh_ray.executor.BudgetCounter serves reserve/add/exceeded the same
    way: through a child of the real level, so refusals say "in a parent run")."""

    remote: ClassVar[bool] = True
    root: Budget | None = None
    child: Budget | None = None

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        self.root = Budget(self.limits)
        self.child = Budget(parent=self.root)

    def reserve(self, **counts: int) -> str | None:
        assert self.child is not None
        return self.child.reserve(**counts)

    def add(self, **counts: float) -> None:
        assert self.root is not None
        self.root.add(**counts)

    def exceeded(self) -> str | None:
        assert self.child is not None
        return self.child.exceeded()


_LIMIT = st.one_of(st.none(), st.integers(0, 6))
_OPS = st.lists(st.one_of(
    st.tuples(st.just("reserve"),
              st.dictionaries(st.sampled_from(["steps", "requests", "tool_calls"]),
                              st.integers(1, 3), min_size=1, max_size=2)),
    st.tuples(st.just("add"), st.fixed_dictionaries({"input_tokens": st.integers(0, 40),
                                                     "output_tokens": st.integers(0, 9)})),
    st.tuples(st.just("exceeded"), st.just({}))), max_size=25)


@given(run=st.tuples(_LIMIT, _LIMIT, _LIMIT), batch=st.tuples(_LIMIT, _LIMIT, _LIMIT, _LIMIT),
       ops=_OPS)
@settings(max_examples=300, deadline=None)
def test_a_remote_budget_level_behaves_as_a_local_parent(
        run: tuple[int | None, ...], batch: tuple[int | None, ...],
        ops: list[tuple[str, dict[str, int]]]) -> None:
    """dsh/host/runcontext.py's walk up the chain stops at a ``remote`` level and hands it the
    rest: every reserve/add/exceeded answers as with a local parent, and every count lands
    at the same levels (the remote level's counters where it keeps them)."""
    run_limits = Limits(steps=run[0], requests=run[1], tool_calls=run[2])
    batch_limits = Limits(steps=batch[0], requests=batch[1], tool_calls=batch[2],
                          total_tokens=batch[3] and batch[3] * 20)
    local_parent = Budget(batch_limits)
    local = Budget(run_limits, parent=local_parent)
    elsewhere = _ElsewhereBudget(batch_limits)
    chained = Budget(run_limits, parent=elsewhere)
    for op, counts in ops:
        a = getattr(local, op)(**counts)
        b = getattr(chained, op)(**counts)
        assert a == b, (op, counts)
    keys = ("steps", "requests", "tool_calls", "input_tokens", "output_tokens")
    assert [getattr(local, k) for k in keys] == [getattr(chained, k) for k in keys]
    assert elsewhere.root is not None
    assert [getattr(local_parent, k) for k in keys] == [getattr(elsewhere.root, k) for k in keys]
    # The remote level's own fields are never written by the chain's walk.
    assert [getattr(elsewhere, k) for k in keys] == [0] * len(keys)


# ------------------------------------------------------------------------------------------
# A batch on the cluster
# ------------------------------------------------------------------------------------------


def _shape(line: dict[str, Any]) -> dict[str, Any]:
    """A result line without what differs between two runs of the same task."""
    return {k: v for k, v in line.items() if k not in ("session", "path")}


def test_a_batch_of_20_runs_on_workers_like_the_local_executor(env: dict[str, Any]) -> None:
    """20 tasks (a tool call, then an answer) through Ray: one result line per task, the
    same lines the local executor writes, every ledger complete in the driver's store, the
    tools run in worker processes; a rerun does nothing (no cluster needed)."""
    m = model(env["dir"], {"tool_calls": [{"name": "whoami", "arguments": {}}],
                           "usage": {"input_tokens": 10, "output_tokens": 2}},
              {"text": "done", "usage": {"input_tokens": 12, "output_tokens": 3}})
    write_tasks(env["dir"] / "tasks.jsonl", 20)
    proc = batch(env, "tasks.jsonl", "-m", m, "--executor", "ray", "--workers", "8",
                 "--results", "ray.jsonl")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == ""
    out = lines(env["dir"] / "ray.jsonl")
    assert sorted(x["id"] for x in out) == sorted(f"t{i}" for i in range(20))
    assert {x["outcome"] for x in out} == {"completed"}
    # The summary counts what the workers spent (the actor's counters, read by the driver).
    assert proc.stderr.startswith("dsh: batch: 20 tasks: 20 completed, 0 failed, 0 left; "
                                  "540 tokens;"), proc.stderr
    pids = set()
    for line in out:
        path = Path(line["path"])
        assert path.parent == env["sessions"]
        events = ledger(path)
        assert [e["type"] for e in events if e["type"].startswith("turn/")] == [
            "turn/start", "turn/end"]
        assert events[-1]["outcome"] == "completed"
        result = next(e for e in events if e["type"] == "tool/result")
        pids.add(int(result["output"]))
    assert os.getpid() not in pids and all(pid > 0 for pid in pids)

    local = batch(env, "tasks.jsonl", "-m", m, "--workers", "8", "--results", "local.jsonl")
    assert local.returncode == 0, local.stderr
    by_id = {x["id"]: _shape(x) for x in lines(env["dir"] / "local.jsonl")}
    assert {x["id"]: _shape(x) for x in out} == by_id

    again = batch(env, "tasks.jsonl", "-m", m, "--executor", "ray", "--results", "ray.jsonl")
    assert again.returncode == 0, again.stderr
    assert "20 completed (20 before)" in again.stderr
    assert len(lines(env["dir"] / "ray.jsonl")) == 20
    assert len(list(env["sessions"].glob("*.jsonl"))) == 40  # 20 Ray + 20 local, no more


def test_the_batch_budget_is_exact_across_workers(env: dict[str, Any]) -> None:
    """``-L requests=9``, 12 tasks of two requests each, 6 at once on the cluster: exactly
    9 requests are made in all; the batch says so and exits 3; a rerun finishes the rest."""
    m = model(env["dir"], {"tool_calls": [{"name": "whoami", "arguments": {}}],
                           "delay": 0.05},
              {"text": "done", "delay": 0.05})
    write_tasks(env["dir"] / "tasks.jsonl", 12)
    proc = batch(env, "tasks.jsonl", "-m", m, "--executor", "ray", "--workers", "6",
                 "-L", "requests=9", "--results", "r.jsonl")
    assert proc.returncode == 3, proc.stderr
    requests = sum(1 for e in all_events(env["sessions"]) if e["type"] == "assistant/message")
    assert requests == 9
    assert "(batch budget: model requests limit reached in a parent run (9/9))" in proc.stderr
    done = lines(env["dir"] / "r.jsonl")
    assert all(x["outcome"] == "completed" for x in done) and len(done) <= 4
    proc = batch(env, "tasks.jsonl", "-m", m, "--executor", "ray", "--workers", "6",
                 "--results", "r.jsonl")
    assert proc.returncode == 0, proc.stderr
    assert f"12 completed ({len(done)} before)" in proc.stderr
    final = lines(env["dir"] / "r.jsonl")
    assert Counter(x["id"] for x in final) == Counter(f"t{i}" for i in range(12))
    assert {x["outcome"] for x in final} == {"completed"}


def test_a_worker_killed_mid_task_leaves_an_interrupted_ledger_and_a_completed_retry(
        env: dict[str, Any]) -> None:
    """Task t1's tool SIGKILLs its Ray worker on the first attempt: the attempt's ledger is
    kept, closed as interrupted (the tool call gets an interrupted result), the task runs
    again in a new session, linked from the journal; one result line per task; a rerun
    changes nothing."""
    ok = model(env["dir"], {"text": "done"})
    marker = env["dir"] / "died-once"
    dying = model(env["dir"], {"tool_calls": [{"name": "die",
                                               "arguments": {"marker": str(marker)}}]},
                  {"text": "done after a death"}, name="dying")
    tasks = env["dir"] / "tasks.jsonl"
    tasks.write_text("".join(json.dumps({"id": f"t{i}", "prompt": f"task {i}",
                                         **({"model": dying} if i == 1 else {})}) + "\n"
                             for i in range(4)))
    proc = batch(env, "tasks.jsonl", "-m", ok, "--executor", "ray", "--workers", "4",
                 "--results", "r.jsonl")
    assert proc.returncode == 0, proc.stderr
    assert marker.exists()
    out = {x["id"]: x for x in lines(env["dir"] / "r.jsonl")}
    assert sorted(out) == ["t0", "t1", "t2", "t3"]
    assert out["t1"]["outcome"] == "completed"
    assert out["t1"]["output"] == "done after a death"

    journal = [x for x in lines(env["dir"] / "r.jsonl.journal") if x["task"] == "t1"]
    starts = [x for x in journal if "session" in x]
    ends = {x["attempt"]: x["outcome"] for x in journal if "outcome" in x}
    assert [x["attempt"] for x in starts] == [1, 2]
    assert ends == {1: "died", 2: "completed"}
    dead, retry = (ledger(env["sessions"] / f"{x['session']}.jsonl") for x in starts)
    assert out["t1"]["session"] == starts[1]["session"]
    # The partial ledger: its tool call interrupted, its turn ended as interrupted.
    result = next(e for e in dead if e["type"] == "tool/result")
    assert result["status"] == "interrupted"
    assert closed_as_interrupted(dead)
    assert retry[-1]["type"] == "turn/end" and retry[-1]["outcome"] == "completed"

    sessions = sorted(p.name for p in env["sessions"].glob("*.jsonl"))
    again = batch(env, "tasks.jsonl", "-m", ok, "--executor", "ray", "--results", "r.jsonl")
    assert again.returncode == 0, again.stderr
    assert "4 completed (4 before)" in again.stderr
    assert len(lines(env["dir"] / "r.jsonl")) == 4
    assert sorted(p.name for p in env["sessions"].glob("*.jsonl")) == sessions


def test_a_worker_that_always_dies_is_the_tasks_error_not_a_loop(env: dict[str, Any]) -> None:
    """A task whose worker dies every time ends ``error`` after three deaths (each attempt
    journalled, each partial ledger closed as interrupted); the other task completes.
    Without an address, the batch starts a local Ray of its own (``num_cpus``) and stops it."""
    env["env"].pop("RAY_ADDRESS")
    env["config"].write_text(env["config"].read_text() + "num_cpus = 1\n")
    ok = model(env["dir"], {"text": "done"})
    killer = model(env["dir"], {"tool_calls": [{"name": "die", "arguments": {}}]},
                   {"text": "never"}, name="killer")
    (env["dir"] / "tasks.jsonl").write_text(
        json.dumps({"id": "a", "prompt": "x"}) + "\n"
        + json.dumps({"id": "b", "prompt": "y", "model": killer}) + "\n")
    proc = batch(env, "tasks.jsonl", "-m", ok, "--executor", "ray", "--results", "r.jsonl")
    assert proc.returncode == 1, proc.stderr
    out = {x["id"]: x for x in lines(env["dir"] / "r.jsonl")}
    assert out["a"]["outcome"] == "completed"
    assert out["b"]["outcome"] == "error"
    assert out["b"]["reason"].startswith("the worker running it died 3 times: ray: ")
    assert "task b (line 2): error: the worker running it died 3 times" in proc.stderr
    # Ray's own logging stays quiet: stderr is dsh's lines only (the failed task, the summary).
    assert [x[:5] for x in proc.stderr.splitlines()] == ["dsh: "] * 2, proc.stderr
    journal = [x for x in lines(env["dir"] / "r.jsonl.journal") if x["task"] == "b"]
    ends = [x["outcome"] for x in journal if "outcome" in x]
    assert ends == ["died", "died", "error"]
    for start in (x for x in journal if "session" in x):
        events = ledger(env["sessions"] / f"{start['session']}.jsonl")
        assert closed_as_interrupted(events)


def test_ctrl_c_twice_aborts_the_runs_on_the_workers(env: dict[str, Any]) -> None:
    """Two SIGINTs while three tasks wait 20 s on the model and one is in a tool that ignores
    aborts: the driver tells the workers (through the budget actor), their runs end
    ``aborted`` within seconds; the deaf tool's Ray task is cancelled (its worker killed),
    its ledger closed as interrupted; no result line, exit code 130; the next run does every
    task."""
    slow = model(env["dir"], {"text": "late", "delay": 20}, name="slow")
    deaf = model(env["dir"], {"tool_calls": [{"name": "block", "arguments": {"seconds": 30}}]},
                 {"text": "late"}, name="deaf")
    (env["dir"] / "tasks.jsonl").write_text("".join(
        json.dumps({"id": f"t{i}", "prompt": f"task {i}", **({"model": deaf} if i == 0 else {})})
        + "\n" for i in range(6)))
    journal = env["dir"] / "r.jsonl.journal"
    proc = subprocess.Popen([sys.executable, "-m", "dsh", "batch", "tasks.jsonl", "-m", slow,
                             "--executor", "ray", "--workers", "4", "--results", "r.jsonl"],
                            env=env["env"], cwd=env["dir"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    def running() -> bool:  # four runs waiting on the model or in the deaf tool
        texts = [p.read_text() for p in env["sessions"].glob("*.jsonl")]
        return (sum('"type":"user/message"' in t for t in texts) >= 4
                and any('"type":"tool/call"' in t for t in texts))

    deadline = time.monotonic() + 60
    while not (env["sessions"].exists() and running()):
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.05)
    time.sleep(0.3)
    started = time.monotonic()
    proc.send_signal(signal.SIGINT)
    time.sleep(0.3)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 130, err
    assert time.monotonic() - started < 10  # not the 20 s the model would take
    assert out == "" and not (env["dir"] / "r.jsonl").read_text()
    assert "6 left (interrupted)" in err
    ends = [ledger(p)[-1] for p in sorted(env["sessions"].glob("*.jsonl"))]
    assert len(ends) == 4
    assert {(e["type"], e["outcome"]) for e in ends} == {("turn/end", "aborted")}
    t0 = [x for x in lines(journal) if x["task"] == "t0"]
    assert [x["outcome"] for x in t0 if "outcome" in x] == ["died"]
    assert closed_as_interrupted(ledger(env["sessions"] / f"{t0[0]['session']}.jsonl"))

    fast = model(env["dir"], {"text": "ok"})
    write_tasks(env["dir"] / "tasks.jsonl", 6)  # the same ids, none deaf now
    again = batch(env, "tasks.jsonl", "-m", fast, "--executor", "ray", "--results", "r.jsonl")
    assert again.returncode == 0, again.stderr
    assert sorted(x["id"] for x in lines(env["dir"] / "r.jsonl")) == [f"t{i}" for i in range(6)]


MARKER = """
import json, sys
from pathlib import Path
import dsh_ray.executor as ex
from dsh.batch.executors import Unit
from dsh.batch.tasks import Task
from dsh.config.loader import config_from_dict
from dsh.host.runcontext import Limits

ex.MARKER_WAIT = 0.0
store = Path(sys.argv[1])
config = config_from_dict({"autoload": False, "sessions_dir": "/nonexistent"})
def unit(sid):
    return Unit(config=config, store=str(store), task=Task(id="a", line=1, index=0, text="hi"),
                agent=None, overrides={"model": "echo"}, limits=None, session=sid, create=True)
budget = ex.RayBudget(Limits())  # no actor: nothing to reserve against
refused = ex.run_remote(unit("s1"), budget, ".dsh-ray-missing")
(store / ".dsh-ray-here").touch()
ran = ex.run_remote(unit("s2"), budget, ".dsh-ray-here")
print(json.dumps([refused, ran]))
"""


def test_a_worker_that_does_not_share_the_drivers_directory_refuses(tmp_path: Path) -> None:
    """A worker that cannot see the driver's marker file in the session directory (another
    machine, no shared filesystem) returns an error naming the directory instead of writing
    the ledger where the driver never looks; one that sees it runs the unit there."""
    store = tmp_path / "sessions"
    store.mkdir()
    proc = subprocess.run([sys.executable, "-c", MARKER, str(store)], capture_output=True,
                          text=True, timeout=60, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    refused, ran = json.loads(proc.stdout.strip().splitlines()[-1])
    assert refused["outcome"] == "error"
    assert refused["reason"].startswith(f"dsh-ray: the driver's session directory {store} is "
                                        "not shared with this worker (node ")
    assert not (store / "s1.jsonl").exists()
    assert ran["outcome"] == "completed" and ran["output"] == "hi"
    assert ran["path"] == str(store / "s2.jsonl")  # the Unit's store, not the config's
    assert closed_as_interrupted(ledger(store / "s2.jsonl")) is False


def test_shipped_ledgers_reach_the_drivers_store_also_from_a_killed_worker(
        env: dict[str, Any]) -> None:
    """``ledgers = "ship"``: workers write their own copy and stream it to the driver, which
    writes it into its store: every ledger is there, whole, with no marker file; a worker
    killed mid-task has its partial ledger (streamed up to the last half second) kept and
    closed as interrupted, and the retry completes."""
    env["config"].write_text(env["config"].read_text() + 'ledgers = "ship"\n')
    ok = model(env["dir"], {"tool_calls": [{"name": "whoami", "arguments": {}}]},
               {"text": "done"})
    marker = env["dir"] / "died-once"
    dying = model(env["dir"], {"tool_calls": [{"name": "die", "arguments": {
        "marker": str(marker), "wait": 1.5}}]}, {"text": "done after a death"}, name="dying")
    (env["dir"] / "tasks.jsonl").write_text("".join(
        json.dumps({"id": f"t{i}", "prompt": f"task {i}", **({"model": dying} if i == 1 else {})})
        + "\n" for i in range(4)))
    proc = batch(env, "tasks.jsonl", "-m", ok, "--executor", "ray", "--workers", "4",
                 "--results", "r.jsonl")
    assert proc.returncode == 0, proc.stderr
    out = {x["id"]: x for x in lines(env["dir"] / "r.jsonl")}
    assert sorted(out) == ["t0", "t1", "t2", "t3"]
    for line in out.values():
        assert line["path"] == str(env["sessions"] / f"{line['session']}.jsonl")
        events = ledger(line["path"])
        assert events[0]["type"] == "turn/start" and events[0]["seq"] == 0
        assert events[-1]["type"] == "turn/end" and events[-1]["outcome"] == "completed"
    assert not list(env["sessions"].glob(".dsh-ray-*"))
    journal = [x for x in lines(env["dir"] / "r.jsonl.journal") if x["task"] == "t1"]
    starts = [x for x in journal if "session" in x]
    assert [x["outcome"] for x in journal if "outcome" in x] == ["died", "completed"]
    dead = ledger(env["sessions"] / f"{starts[0]['session']}.jsonl")
    assert any(e["type"] == "tool/call" and e["name"] == "die" for e in dead)
    assert next(e for e in dead if e["type"] == "tool/result")["status"] == "interrupted"
    assert closed_as_interrupted(dead)
    again = batch(env, "tasks.jsonl", "-m", ok, "--executor", "ray", "--results", "r.jsonl")
    assert again.returncode == 0 and "4 completed (4 before)" in again.stderr, again.stderr
