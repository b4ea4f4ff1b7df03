"""``dsh batch`` (issue 16): tasks, results, the journal, resume after SIGKILL and Ctrl-C,
budgets across workers, retries, ``--ordered``, executors, progress and summary.

The CLI is run as a real subprocess (signals, exit codes, files a killed process leaves);
the model is ``scripted:FILE`` with ``delay``, so a task's timing is known.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st

from dsh.batch.tasks import load_tasks
from dsh.batch.tasks import task_text
from dsh.core.errors import UsageError


@pytest.fixture
def env(tmp_path: Path) -> dict[str, Any]:
    """A config (sessions under tmp_path, no plugins autoloaded) and the environment."""
    config = tmp_path / "config.toml"
    config.write_text(f'sessions_dir = "{tmp_path / "sessions"}"\nautoload = false\n')
    environ = {**os.environ, "DSH_HOME": str(tmp_path / "home"), "DSH_CONFIG": str(config),
               "XDG_CONFIG_HOME": str(tmp_path / "xdg")}
    environ.pop("OPENAI_API_KEY", None)
    environ.pop("ANTHROPIC_API_KEY", None)
    return {"dir": tmp_path, "env": environ, "sessions": tmp_path / "sessions"}


def model(tmp_path: Path, *responses: dict[str, Any], name: str = "script") -> str:
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps({"responses": list(responses)}))
    return f"scripted:{path}"


def write_tasks(path: Path, n: int, **extra: Any) -> Path:
    path.write_text("".join(json.dumps({"id": f"t{i}", "prompt": f"task {i}", **extra}) + "\n"
                            for i in range(n)))
    return path


def batch(env: dict[str, Any], *args: str, stdin: str | None = None,
          timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "dsh", "batch", *args], env=env["env"],
                          cwd=env["dir"], capture_output=True, text=True, input=stdin,
                          timeout=timeout)


def popen(env: dict[str, Any], *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "dsh", "batch", *args], env=env["env"],
                            cwd=env["dir"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)


def result_lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def ledgers(sessions: Path) -> list[list[dict[str, Any]]]:
    out = []
    for path in sorted(sessions.glob("*.jsonl")):
        lines = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
        if lines:
            out.append(lines)
    return out


def completed_by_prompt(sessions: Path) -> Counter[str]:
    """How many completed turns each first prompt (``task N``) has across all ledgers."""
    done: Counter[str] = Counter()
    for events in ledgers(sessions):
        prompt = next((e["text"] for e in events if e["type"] == "user/message"), "")
        done[prompt.split("\n")[0]] += sum(1 for e in events if e["type"] == "turn/end"
                                           and e["outcome"] == "completed")
    return done


def wait_for_lines(path: Path, n: int, proc: subprocess.Popen[str], timeout: float = 30) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if path.exists() and path.read_text().count("\n") >= n:
            return
        if proc.poll() is not None:
            raise AssertionError(f"batch ended early: {proc.communicate()}")
        time.sleep(0.01)
    raise AssertionError(f"{path} never had {n} lines")


# ------------------------------------------------------------------------------------------
# Tasks
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("lines", "message"), [
    (['{"id": "a", "prompt": "x"}', '{"prompt": "y"}'], "tasks.jsonl:2: 'id' is required"),
    (['{"id": "a", "prompt": "x"}', "", '{"id": "a", "prompt": "y"}'],
     "tasks.jsonl:3: duplicate id 'a' (first on line 1)"),
    (['{"id": 1, "prompt": "x"}', "{nope"], "tasks.jsonl:2: not valid JSON"),
    (['[1, 2]'], "tasks.jsonl:1: expected a JSON object, got list"),
    (['{"id": "a", "promt": "x"}'], "tasks.jsonl:1: unknown key 'promt'"),
    (['{"id": "a"}'], "tasks.jsonl:1: no prompt: give 'prompt' or 'input'"),
    (['{"id": "a", "prompt": 3}'], "tasks.jsonl:1: 'prompt' must be a string"),
    (['{"id": "a", "prompt": "x", "options": [1]}'], "tasks.jsonl:1: 'options' must be an"),
    (['{"id": true, "prompt": "x"}'], "tasks.jsonl:1: 'id' is required"),
])
def test_bad_line_is_named_before_any_task_starts(env: dict[str, Any], lines: list[str],
                                                  message: str) -> None:
    tasks = env["dir"] / "tasks.jsonl"
    # A valid first task would run first if validation were lazy: no session may appear.
    tasks.write_text("\n".join(lines) + "\n")
    proc = batch(env, "tasks.jsonl", "-m", model(env["dir"], {"text": "ok"}))
    assert proc.returncode == 2, proc.stderr
    assert f"dsh: error: {message}" in proc.stderr
    assert proc.stdout == ""
    assert not env["sessions"].exists() or not list(env["sessions"].glob("*.jsonl"))


def test_unknown_agent_and_session_named_with_their_line(env: dict[str, Any]) -> None:
    tasks = env["dir"] / "tasks.jsonl"
    tasks.write_text('{"id": 1, "prompt": "x"}\n{"id": 2, "prompt": "y", "agent": "nobody"}\n')
    proc = batch(env, "tasks.jsonl", "-m", model(env["dir"], {"text": "ok"}))
    assert proc.returncode == 2
    assert "dsh: error: tasks.jsonl:2: unknown agent 'nobody'" in proc.stderr
    tasks.write_text('{"id": 1, "prompt": "x", "session": "nosuch"}\n')
    proc = batch(env, "tasks.jsonl", "-m", model(env["dir"], {"text": "ok"}))
    assert proc.returncode == 2
    assert "tasks.jsonl:1: no session 'nosuch'" in proc.stderr


def test_input_is_the_stdin_block_of_dsh_run() -> None:
    assert task_text("Summarise", "line 1\nline 2\n\n") == \
        "Summarise\n\n<stdin>\nline 1\nline 2\n</stdin>"
    assert task_text(None, "only input\n") == "only input"
    assert task_text("p", "  \n") == "p"


task_values = st.one_of(st.none(), st.integers(-5, 5), st.text(max_size=4), st.booleans(),
                        st.lists(st.integers(), max_size=2),
                        st.dictionaries(st.text(max_size=3), st.integers(), max_size=2))
task_lines = st.lists(st.one_of(
    st.fixed_dictionaries({"id": st.one_of(st.integers(0, 20), st.text(max_size=3))},
                          optional={"prompt": st.one_of(st.text(max_size=5), st.integers()),
                                    "input": st.text(max_size=5), "agent": task_values,
                                    "options": task_values}),
    st.dictionaries(st.sampled_from(["id", "prompt", "x"]), task_values, max_size=3),
), max_size=8)


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(task_lines)
def test_load_tasks_accepts_exactly_the_valid_files(items: list[dict[str, Any]]) -> None:
    """Either every line becomes a task, in order, with its id and the text dsh run would
    send, or the error names the first bad line."""
    raw = "\n".join(json.dumps(item) for item in items).encode()

    def bad(i: int, item: dict[str, Any]) -> bool:
        tid = item.get("id")
        earlier = [str(x.get("id")) for x in items[:i]]
        return (set(item) - {"id", "prompt", "input", "agent", "options"} != set()
                or isinstance(tid, bool) or not isinstance(tid, (str, int)) or tid == ""
                or str(tid) in earlier
                or any(item.get(k) is not None and not isinstance(item[k], str)
                       for k in ("prompt", "input", "agent"))
                or (item.get("options") is not None and not isinstance(item["options"], dict))
                or not task_text(item.get("prompt"), item.get("input")))

    first_bad = next((i for i, item in enumerate(items) if bad(i, item)), None)
    if first_bad is None:
        tasks = load_tasks(raw, "f")
        assert [t.id for t in tasks] == [item["id"] for item in items]
        assert [t.line for t in tasks] == list(range(1, len(items) + 1))
        assert [t.text for t in tasks] == [task_text(i.get("prompt"), i.get("input"))
                                           for i in items]
    else:
        with pytest.raises(UsageError, match=rf"^f:{first_bad + 1}: "):
            load_tasks(raw, "f")


# ------------------------------------------------------------------------------------------
# Results
# ------------------------------------------------------------------------------------------


def test_results_are_dsh_run_json_plus_id(env: dict[str, Any]) -> None:
    m = model(env["dir"], {"text": "answer", "usage": {"input_tokens": 7, "output_tokens": 3}})
    tasks = write_tasks(env["dir"] / "tasks.jsonl", 5, input="data\n")
    proc = batch(env, str(tasks), "-m", m, "--workers", "3")
    assert proc.returncode == 0, proc.stderr
    lines = [json.loads(x) for x in proc.stdout.splitlines()]
    assert sorted(x["id"] for x in lines) == [f"t{i}" for i in range(5)]
    run = subprocess.run([sys.executable, "-m", "dsh", "run", "--json", "-m", m, "task 0"],
                         env=env["env"], capture_output=True, text=True, check=True)
    single = json.loads(run.stdout)
    first = next(x for x in lines if x["id"] == "t0")
    assert set(first) == {"id", *single}
    assert first["outcome"] == "completed" and first["output"] == "answer"
    assert first["usage"] == {"input_tokens": 7, "output_tokens": 3}
    # The input went in as dsh run's stdin block.
    events = [json.loads(x) for x in Path(first["path"]).read_text().splitlines()]
    user = next(e for e in events if e["type"] == "user/message")
    assert user["text"] == "task 0\n\n<stdin>\ndata\n</stdin>"
    # One summary line on stderr (not a terminal: no progress bar), nothing else.
    assert proc.stderr.count("\n") == 1
    assert "dsh: batch: 5 tasks: 5 completed, 0 failed, 0 left; 50 tokens" in proc.stderr


def test_tasks_from_stdin_with_their_own_model_and_options(env: dict[str, Any]) -> None:
    a = model(env["dir"], {"text": "from a"}, name="a")
    b = model(env["dir"], {"text": "from b"}, name="b")
    stdin = (json.dumps({"id": 1, "prompt": "x"}) + "\n"
             + json.dumps({"id": 2, "prompt": "y", "model": b,
                           "options": {"temperature": 0.5}}) + "\n")
    proc = batch(env, "-", "-m", a, "-o", "top_p=0.9", stdin=stdin)
    assert proc.returncode == 0, proc.stderr
    by_id = {x["id"]: x for x in map(json.loads, proc.stdout.splitlines())}
    assert by_id[1]["output"] == "from a" and by_id[2]["output"] == "from b"
    events = [json.loads(x) for x in Path(by_id[2]["path"]).read_text().splitlines()]
    assert events[0]["options"] == {"top_p": 0.9, "temperature": 0.5}


def test_ordered_writes_in_input_order(env: dict[str, Any]) -> None:
    """Task i waits (n - i) × 250 ms (wide for a loaded machine): they end in reverse order;
    --ordered restores it."""
    n = 6
    lines = []
    for i in range(n):
        m = model(env["dir"], {"text": f"a{i}", "delay": (n - i) * 0.25}, name=f"m{i}")
        lines.append(json.dumps({"id": i, "prompt": f"task {i}", "model": m}))
    (env["dir"] / "tasks.jsonl").write_text("\n".join(lines) + "\n")
    proc = batch(env, "tasks.jsonl", "--workers", str(n))
    assert proc.returncode == 0, proc.stderr
    assert [json.loads(x)["id"] for x in proc.stdout.splitlines()] == list(range(n))[::-1]
    proc = batch(env, "tasks.jsonl", "--workers", str(n), "--ordered",
                 "--results", "ordered.jsonl")
    assert proc.returncode == 0, proc.stderr
    assert [x["id"] for x in result_lines(env["dir"] / "ordered.jsonl")] == list(range(n))


# ------------------------------------------------------------------------------------------
# Resume: SIGKILL, Ctrl-C, retries
# ------------------------------------------------------------------------------------------


def check_exactly_once(env: dict[str, Any], results: Path, n: int) -> None:
    lines = result_lines(results)
    assert Counter(x["id"] for x in lines) == Counter(f"t{i}" for i in range(n))
    assert all(x["outcome"] == "completed" for x in lines)
    done = completed_by_prompt(env["sessions"])
    assert {f"task {i}": done[f"task {i}"] for i in range(n)} == {f"task {i}": 1
                                                                  for i in range(n)}
    # Every session a killed process left open was closed (as interrupted) on the rerun.
    for events in ledgers(env["sessions"]):
        starts = sum(1 for e in events if e["type"] == "turn/start")
        ends = [e for e in events if e["type"] == "turn/end"]
        assert len(ends) == starts
        assert all(e["outcome"] in ("completed", "stopped", "aborted")
                   or "interrupted" in e["reason"]
                   or "in a parent run" in e["reason"] for e in ends), ends


@pytest.mark.parametrize("kill_after", [0, 1, 4, 7])
def test_sigkill_then_rerun_gives_each_task_one_session_and_one_line(
        env: dict[str, Any], kill_after: int) -> None:
    """Killed after ``kill_after`` result lines (0: as soon as the first task has started),
    with other tasks mid-turn; every rerun after that ends with exactly one completed session
    and one result line per task."""
    n = 12
    m = model(env["dir"], {"tool_calls": [{"name": "none", "arguments": {}}], "delay": 0.08},
              {"text": "done", "delay": 0.08})
    write_tasks(env["dir"] / "tasks.jsonl", n)
    results = env["dir"] / "r.jsonl"
    args = ("tasks.jsonl", "--results", "r.jsonl", "-m", m, "--workers", "3")
    proc = popen(env, *args)
    if kill_after:
        wait_for_lines(results, kill_after, proc)
    else:
        wait_for_lines(env["dir"] / "r.jsonl.journal", 1, proc)
    proc.kill()
    proc.communicate()
    before = len(result_lines(results)) if results.exists() else 0
    assert before < n, "the batch finished before it was killed"
    # A second kill during the rerun, then a rerun to the end.
    proc = popen(env, *args)
    wait_for_lines(results, before + 1, proc)
    proc.kill()
    proc.communicate()
    final = batch(env, *args)
    assert final.returncode == 0, final.stderr
    assert "closed turn" not in final.stdout
    check_exactly_once(env, results, n)
    again = batch(env, *args)
    assert again.returncode == 0
    assert f"{n} completed ({n} before)" in again.stderr
    check_exactly_once(env, results, n)


def test_turn_ended_but_no_result_line_is_recovered_from_the_ledger(env: dict[str, Any]) -> None:
    """A process killed after a turn completed but before its line: the rerun writes the line
    from the ledger instead of running the task again."""
    m = model(env["dir"], {"text": "the answer", "usage": {"input_tokens": 4,
                                                           "output_tokens": 2}})
    write_tasks(env["dir"] / "tasks.jsonl", 3)
    results = env["dir"] / "r.jsonl"
    args = ("tasks.jsonl", "--results", "r.jsonl", "-m", m)
    assert batch(env, *args).returncode == 0
    lines = result_lines(results)
    lost = next(x for x in lines if x["id"] == "t1")
    results.write_text("".join(json.dumps(x) + "\n" for x in lines if x["id"] != "t1"))
    journal = env["dir"] / "r.jsonl.journal"
    kept = [x for x in journal.read_text().splitlines()
            if not (json.loads(x)["task"] == "t1" and "outcome" in json.loads(x))]
    journal.write_text("\n".join(kept) + "\n")
    proc = batch(env, *args)
    assert proc.returncode == 0, proc.stderr
    again = next(x for x in result_lines(results) if x["id"] == "t1")
    for key in ("session", "outcome", "output", "usage", "steps", "path"):
        assert again[key] == lost[key], key
    check_exactly_once(env, results, 3)


def test_torn_last_result_line_is_cut(env: dict[str, Any]) -> None:
    m = model(env["dir"], {"text": "ok"})
    write_tasks(env["dir"] / "tasks.jsonl", 3)
    results = env["dir"] / "r.jsonl"
    args = ("tasks.jsonl", "--results", "r.jsonl", "-m", m)
    assert batch(env, *args).returncode == 0
    data = results.read_bytes()
    results.write_bytes(data[:-20])  # the last line torn mid-write
    proc = batch(env, *args)
    assert proc.returncode == 0, proc.stderr
    assert len(result_lines(results)) == 3


def test_ctrl_c_stops_starting_tasks_and_the_rerun_finishes(env: dict[str, Any]) -> None:
    n = 8
    m = model(env["dir"], {"tool_calls": [{"name": "none", "arguments": {}}], "delay": 0.15},
              {"text": "done", "delay": 0.15})
    write_tasks(env["dir"] / "tasks.jsonl", n)
    results = env["dir"] / "r.jsonl"
    args = ("tasks.jsonl", "--results", "r.jsonl", "-m", m, "--workers", "2")
    proc = popen(env, *args)
    wait_for_lines(env["dir"] / "r.jsonl.journal", 1, proc)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 130, err
    assert "stopping: no new tasks" in err
    journal = result_lines(env["dir"] / "r.jsonl.journal")
    started = {x["task"] for x in journal if "session" in x}
    assert len(started) <= 2  # no task started after the Ctrl-C
    assert all(x["outcome"] == "left" for x in journal if "outcome" in x)
    left = n - len(result_lines(results)) if results.exists() else n
    assert f"{left} left" in err
    final = batch(env, *args)
    assert final.returncode == 0, final.stderr
    check_exactly_once(env, results, n)


def test_second_ctrl_c_aborts_running_tasks(env: dict[str, Any]) -> None:
    m = model(env["dir"], {"text": "slow", "delay": 20})
    write_tasks(env["dir"] / "tasks.jsonl", 4)
    proc = popen(env, "tasks.jsonl", "--results", "r.jsonl", "-m", m, "--workers", "2")
    wait_for_lines(env["dir"] / "r.jsonl.journal", 2, proc)
    # Both running tasks are inside their model step (a journal line is written before the
    # turn starts: a first Ctrl-C landing before the step ended the batch at once, and the
    # second then hit a process already on its way out).
    end = time.monotonic() + 30
    while sum(1 for events in ledgers(env["sessions"]) for e in events
              if e["type"] == "step/start") < 2:
        assert proc.poll() is None and time.monotonic() < end, proc.communicate()
        time.sleep(0.01)
    chunks: list[str] = []
    reader = threading.Thread(target=lambda: chunks.extend(iter(proc.stderr.readline, "")))
    reader.start()
    start = time.monotonic()
    proc.send_signal(signal.SIGINT)
    while "Ctrl-C again" not in "".join(chunks):  # the first one was taken: not merged
        assert time.monotonic() < end, chunks
        time.sleep(0.01)
    proc.send_signal(signal.SIGINT)
    proc.wait(timeout=15)
    reader.join(15)
    proc.communicate(timeout=15)  # closes the pipes
    err = "".join(chunks)
    assert proc.returncode == 130
    assert time.monotonic() - start < 8  # not the 20 s the model would wait
    assert "4 left" in err
    for events in ledgers(env["sessions"]):
        assert events[-1]["type"] == "turn/end"
        assert events[-1]["outcome"] in ("aborted", "stopped")  # ended long before its 20 s


def test_failed_tasks_are_retried_up_to_retries(env: dict[str, Any]) -> None:
    bad = model(env["dir"], {"error": "boom", "status": 400}, name="bad")
    good = model(env["dir"], {"text": "fine"}, name="good")
    (env["dir"] / "tasks.jsonl").write_text(
        json.dumps({"id": "ok", "prompt": "task ok", "model": good}) + "\n"
        + json.dumps({"id": "ko", "prompt": "task ko", "model": bad}) + "\n")
    args = ("tasks.jsonl", "--results", "r.jsonl", "--retries", "2")
    proc = batch(env, *args)
    assert proc.returncode == 1
    assert "1 completed, 1 failed" in proc.stderr
    assert "task ko (line 2): error: scripted: boom" in proc.stderr
    journal = result_lines(env["dir"] / "r.jsonl.journal")
    assert sum(1 for x in journal if x["task"] == "ko" and "session" in x) == 3
    assert sum(1 for x in journal if x["task"] == "ok" and "session" in x) == 1
    lines = result_lines(env["dir"] / "r.jsonl")
    assert Counter(x["id"] for x in lines) == {"ok": 1, "ko": 1}
    # Rerun with the same --retries: nothing left to try.
    proc = batch(env, *args)
    assert proc.returncode == 1
    assert "1 completed (1 before), 1 failed (1 before), 0 left" in proc.stderr
    assert sum(1 for x in result_lines(env["dir"] / "r.jsonl.journal")
               if x["task"] == "ko" and "session" in x) == 3
    # One more retry allowed: one more attempt, and still one line per task.
    proc = batch(env, "tasks.jsonl", "--results", "r.jsonl", "--retries", "3")
    assert sum(1 for x in result_lines(env["dir"] / "r.jsonl.journal")
               if x["task"] == "ko" and "session" in x) == 4
    assert Counter(x["id"] for x in result_lines(env["dir"] / "r.jsonl")) == {"ok": 1, "ko": 1}


def test_a_second_batch_on_the_same_results_is_refused(env: dict[str, Any]) -> None:
    # The first batch must still be running when the second starts: under load a 3 s model
    # had finished first (the second then found the batch done). It is killed below.
    m = model(env["dir"], {"text": "slow", "delay": 60})
    write_tasks(env["dir"] / "tasks.jsonl", 1)
    proc = popen(env, "tasks.jsonl", "--results", "r.jsonl", "-m", m)
    try:
        wait_for_lines(env["dir"] / "r.jsonl.journal", 1, proc)
        other = batch(env, "tasks.jsonl", "--results", "r.jsonl", "-m", m)
        assert other.returncode == 2
        assert "another dsh batch is using" in other.stderr
    finally:
        proc.kill()
        proc.communicate()


def test_results_on_stdout_keep_their_journal_under_the_data_dir(env: dict[str, Any]) -> None:
    m = model(env["dir"], {"text": "ok"})
    write_tasks(env["dir"] / "tasks.jsonl", 2)
    assert len(batch(env, "tasks.jsonl", "-m", m).stdout.splitlines()) == 2
    journals = list((env["dir"] / "batches").glob("*.journal"))
    assert len(journals) == 1
    rerun = batch(env, "tasks.jsonl", "-m", m)
    assert rerun.stdout == "" and "2 completed (2 before)" in rerun.stderr


# ------------------------------------------------------------------------------------------
# Budgets
# ------------------------------------------------------------------------------------------


def requests_in_ledgers(sessions: Path) -> int:
    return sum(1 for events in ledgers(sessions) for e in events
               if e["type"] == "assistant/message")


def test_batch_limit_is_exact_across_workers(env: dict[str, Any]) -> None:
    """-L requests=7 over 8 workers and 3-request tasks: exactly 7 requests in all the
    ledgers; the batch stops starting tasks and says how many are left; a rerun finishes."""
    n = 12
    m = model(env["dir"], {"tool_calls": [{"name": "none", "arguments": {}}], "delay": 0.02},
              {"tool_calls": [{"name": "none", "arguments": {}}], "delay": 0.02},
              {"text": "done", "delay": 0.02})
    write_tasks(env["dir"] / "tasks.jsonl", n)
    args = ("tasks.jsonl", "--results", "r.jsonl", "-m", m, "--workers", "8")
    proc = batch(env, *args, "-L", "requests=7")
    assert proc.returncode == 3, proc.stderr
    assert requests_in_ledgers(env["sessions"]) == 7
    lines = result_lines(env["dir"] / "r.jsonl") if (env["dir"] / "r.jsonl").exists() else []
    assert len(lines) <= 2 and all(x["outcome"] == "completed" for x in lines)
    assert f"{n - len(lines)} left (batch budget: model requests limit reached" in proc.stderr
    final = batch(env, *args)
    assert final.returncode == 0, final.stderr
    check_exactly_once(env, env["dir"] / "r.jsonl", n)


def test_task_limit_limits_each_task(env: dict[str, Any]) -> None:
    m = model(env["dir"], {"tool_calls": [{"name": "none", "arguments": {}}]},
              {"text": "done"})
    write_tasks(env["dir"] / "tasks.jsonl", 3)
    proc = batch(env, "tasks.jsonl", "-m", m, "--task-limit", "requests=1", "--workers", "3")
    assert proc.returncode == 1
    lines = [json.loads(x) for x in proc.stdout.splitlines()]
    assert [x["outcome"] for x in lines] == ["budget"] * 3
    assert all("model requests limit reached (1/1)" in x["reason"] for x in lines)
    assert requests_in_ledgers(env["sessions"]) == 3


def test_token_limit_stops_the_batch_within_its_bound(env: dict[str, Any]) -> None:
    """Tokens are known after a request: the batch may overshoot by the requests in flight
    (at most --workers of them) and no more."""
    m = model(env["dir"], {"text": "x", "delay": 0.02,
                           "usage": {"input_tokens": 10, "output_tokens": 0}})
    write_tasks(env["dir"] / "tasks.jsonl", 20)
    proc = batch(env, "tasks.jsonl", "-m", m, "--workers", "2", "-L", "input_tokens=50")
    assert proc.returncode == 3, proc.stderr
    spent = requests_in_ledgers(env["sessions"]) * 10
    assert 50 <= spent <= 50 + 2 * 10
    assert "input tokens limit reached" in proc.stderr


# ------------------------------------------------------------------------------------------
# Executors and imports
# ------------------------------------------------------------------------------------------


def test_executor_hook_replaces_the_local_one(env: dict[str, Any]) -> None:
    """A plugin's executor (here: one that runs tasks one at a time, in reverse) is used for
    its name; an unknown name is a usage error."""
    plugin = env["dir"] / "rev_executor.py"
    plugin.write_text(
        "import dsh\n"
        "class Reverse:\n"
        "    def run(self, job, tasks, *, workers):\n"
        "        for task in reversed(list(tasks)):\n"
        "            yield job(task)\n"
        "    def close(self):\n"
        "        pass\n"
        "@dsh.hookimpl\n"
        "def batch_executor(name):\n"
        "    return Reverse() if name == 'reverse' else None\n")
    config = Path(env["env"]["DSH_CONFIG"])
    config.write_text(config.read_text() + 'load = ["rev_executor"]\n')
    env["env"]["PYTHONPATH"] = str(env["dir"])
    m = model(env["dir"], {"text": "ok"})
    write_tasks(env["dir"] / "tasks.jsonl", 4)
    proc = batch(env, "tasks.jsonl", "-m", m, "--executor", "reverse")
    assert proc.returncode == 0, proc.stderr
    assert [json.loads(x)["id"] for x in proc.stdout.splitlines()] == ["t3", "t2", "t1", "t0"]
    proc = batch(env, "tasks.jsonl", "-m", m, "--executor", "nope")
    assert proc.returncode == 2
    assert "--executor: no executor 'nope'" in proc.stderr


def test_dsh_run_does_not_import_the_batch_module(env: dict[str, Any]) -> None:
    code = ("import sys\nfrom dsh.cli.root import main\nsys.argv = ['dsh', 'run', 'hi']\n"
            "try:\n    main()\nexcept SystemExit:\n    pass\n"
            "print('dsh.batch' in sys.modules, file=sys.stderr)\n")
    proc = subprocess.run([sys.executable, "-c", code], env=env["env"], capture_output=True,
                          text=True)
    assert proc.stderr.strip().endswith("False"), proc.stderr


#: Every public name ``dsh.batch.runner`` defined before it was split (issue 21), and its home.
OLD_RUNNER_NAMES = {
    "tasks": ["TASK_KEYS", "Task", "task_text", "load_tasks", "read_tasks"],
    "journal": ["Attempt", "Journal", "ResultsFile", "journal_path", "result_from_ledger",
                "iter_lines"],
    "executors": ["Executor", "RemoteExecutor", "LocalExecutor", "WorkerLost", "Unit",
                  "run_unit", "result_data", "result_from_data", "get_executor"],
    "progress": ["Progress", "Signals"],
    "runner": ["OK", "Outcome", "Batch", "run_batch"],
}


@pytest.mark.parametrize("home", sorted(OLD_RUNNER_NAMES))
def test_the_names_of_the_old_runner_module_still_resolve(home: str) -> None:
    """Split into tasks/journal/executors/progress/runner: ``dsh.batch.runner.NAME`` and
    ``dsh.batch.NAME`` are still the very object, which lives (and is defined) in its new
    module; a name that was never there is still an AttributeError."""
    import importlib

    import dsh.batch
    import dsh.batch.runner

    module = importlib.import_module(f"dsh.batch.{home}")
    for name in OLD_RUNNER_NAMES[home]:
        obj = getattr(module, name)
        assert getattr(dsh.batch.runner, name) is obj, name
        assert getattr(dsh.batch, name) is obj, name
        if hasattr(obj, "__module__") and not isinstance(obj, (str, tuple)):
            assert obj.__module__ == module.__name__, name
    with pytest.raises(AttributeError):
        dsh.batch.no_such_name  # noqa: B018


# ------------------------------------------------------------------------------------------
# Shared backoff on 429 (dsh.llm.http.errors.RATE_GATE)
# ------------------------------------------------------------------------------------------


def test_a_429_pauses_every_request_to_that_endpoint(monkeypatch: pytest.MonkeyPatch) -> None:
    """Run A gets a 429 with Retry-After: 1; run B, started after it on another thread,
    reaches the server only once the pause is over (without the gate: at once)."""
    import threading

    from dsh.core.messages import Message
    from dsh.core.messages import ModelRequest
    from dsh.llm.http.errors import RATE_GATE
    from dsh.llm.openai import OpenAIModel
    from dsh.llm.transport import send
    from tests.servers import Reply
    from tests.servers import ScriptedServer
    from tests.servers import openai_completion

    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-batch")
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    with ScriptedServer() as server:
        server.script(Reply(429, {"error": {"message": "slow down"}},
                            headers={"Retry-After": "1"}),
                      Reply(body=openai_completion("a")), Reply(body=openai_completion("b")))
        model = OpenAIModel("gpt-4o-mini", {"base_url": server.url + "/v1"})
        req = ModelRequest(model="openai:gpt-4o-mini",
                           messages=[Message(role="user", content="hi")])
        answers: dict[str, str] = {}
        a = threading.Thread(target=lambda: answers.setdefault("a", send(req, model=model).text))
        a.start()
        end = time.monotonic() + 5
        while RATE_GATE.remaining(model.endpoint()) == 0 and time.monotonic() < end:
            time.sleep(0.005)
        assert RATE_GATE.remaining(model.endpoint()) > 0.5
        start = time.monotonic()
        b = threading.Thread(target=lambda: answers.setdefault("b", send(req, model=model).text))
        b.start()
        time.sleep(0.5)
        assert len(server.received) == 1  # B is waiting, not sending
        b.join(5)
        a.join(5)
        assert time.monotonic() - start >= 0.8
        assert sorted(answers.values()) == ["a", "b"]
        assert len(server.received) == 3


# ------------------------------------------------------------------------------------------
# Progress
# ------------------------------------------------------------------------------------------


def test_progress_on_a_terminal_stderr_never_on_stdout(env: dict[str, Any]) -> None:
    import pty

    m = model(env["dir"], {"text": "ok", "delay": 0.3,
                           "usage": {"input_tokens": 100, "output_tokens": 5}})
    write_tasks(env["dir"] / "tasks.jsonl", 6)
    master, slave = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "dsh", "batch", "tasks.jsonl", "-m", m,
                             "--workers", "2"], env=env["env"], cwd=env["dir"],
                            stdout=subprocess.PIPE, stderr=slave, text=True)
    os.close(slave)
    out, _ = proc.communicate(timeout=30)
    err = b""
    while True:
        try:
            chunk = os.read(master, 65536)
        except OSError:
            break
        if not chunk:
            break
        err += chunk
    os.close(master)
    assert proc.returncode == 0
    assert len(out.splitlines()) == 6 and all(x.startswith('{"id":') for x in out.splitlines())
    text = err.decode()
    assert "\x1b[2K" in text and " running · " in text and "/s · ETA" in text
    assert "tokens" in text
    assert "dsh: batch: 6 tasks: 6 completed, 0 failed, 0 left; 630 tokens" in text


def test_sigterm_aborts_and_the_rerun_finishes(env: dict[str, Any]) -> None:
    m = model(env["dir"], {"text": "slow", "delay": 0.4})
    write_tasks(env["dir"] / "tasks.jsonl", 6)
    args = ("tasks.jsonl", "--results", "r.jsonl", "-m", m, "--workers", "2")
    proc = popen(env, *args)
    wait_for_lines(env["dir"] / "r.jsonl.journal", 2, proc)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=15)
    assert proc.returncode == 130, err
    assert "left" in err
    final = batch(env, *args)
    assert final.returncode == 0, final.stderr
    check_exactly_once(env, env["dir"] / "r.jsonl", 6)


def test_a_task_continues_its_session(env: dict[str, Any]) -> None:
    m = model(env["dir"], {"text": "first"}, {"text": "second"})
    run = subprocess.run([sys.executable, "-m", "dsh", "run", "--json", "-m", m, "hello"],
                         env=env["env"], capture_output=True, text=True, check=True)
    sid = json.loads(run.stdout)["session"]
    (env["dir"] / "tasks.jsonl").write_text(
        json.dumps({"id": "c", "prompt": "and then?", "session": sid}) + "\n")
    proc = batch(env, "tasks.jsonl", "-m", m)
    assert proc.returncode == 0, proc.stderr
    line = json.loads(proc.stdout)
    assert line["session"] == sid and line["output"] == "second"
    events = [json.loads(x) for x in Path(line["path"]).read_text().splitlines()]
    assert [e["text"] for e in events if e["type"] == "user/message"] == ["hello", "and then?"]


def test_each_result_line_carries_the_cost_dsh_run_reports(env: dict[str, Any]) -> None:
    m = model(env["dir"], {"text": "answer",
                           "usage": {"input_tokens": 1000, "output_tokens": 500}})
    config = Path(env["env"]["DSH_CONFIG"])
    config.write_text(config.read_text() + f'[models.{json.dumps(m)}]\n'
                      'price = {input = 2.0, output = 8.0}\n')
    single = subprocess.run([sys.executable, "-m", "dsh", "run", "--json", "-m", m, "task 0"],
                            env=env["env"], capture_output=True, text=True, check=True)
    cost = json.loads(single.stdout)["cost"]
    assert cost is not None and cost > 0
    tasks = write_tasks(env["dir"] / "tasks.jsonl", 3)
    proc = batch(env, str(tasks), "-m", m, "--workers", "2")
    assert proc.returncode == 0, proc.stderr
    assert [json.loads(x)["cost"] for x in proc.stdout.splitlines()] == [cost] * 3


def test_a_result_sent_back_by_a_worker_keeps_its_cost() -> None:
    """What an executor's worker sends back (dsh-ray's, a plugin's) is turned into a result
    again with its cost; a worker of an older dsh sends none: the cost is unknown."""
    from dsh.batch.executors import result_data
    from dsh.batch.executors import result_from_data
    from dsh.core.messages import Usage
    from dsh.run.app import RunResult

    result = RunResult(output="x", session_id="s", outcome="completed", reason="", steps=1,
                       usage=Usage(input_tokens=3, output_tokens=2), cost=0.0125)
    data = json.loads(json.dumps(result_data(result)))  # it travels as plain data
    assert result_from_data(data).cost == 0.0125
    del data["cost"]
    assert result_from_data(data).cost is None
