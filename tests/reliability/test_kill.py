"""SIGKILL a real ``dsh run`` at seeded random points: the ledger survives every kill.

Each run is ``python -m dsh run --events -m scripted:FILE`` whose scripted model calls a small
test tool (``nap``, sleeping 5–30 ms) in several steps, so kills land before the first answer,
between a ``tool/call`` and its ``tool/result``, at step boundaries, and after the turn ended.
The test reads the ``--events`` lines as they come: every persistent event printed is already
written to the ledger (``write(2)`` happens before the line is printed, and the page cache
survives SIGKILL), so each one must be in the ledger afterwards, byte for byte and in order.
After each kill the ledger loads (and is repaired), resumes with the library, and the resumed
request holds no tool call without its result.
"""

from __future__ import annotations

import collections
import json
import os
import random
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from dsh.app import App
from dsh.config import config_from_dict
from dsh.history import derive_messages
from dsh.hookspecs import hookimpl
from dsh.ledger import JsonlStore
from dsh.messages import Message

SEED = 1234
RUNS = 200
WORKERS = 4
MAX_DELAY = 0.2  # seconds after the first --events line; a whole run takes ~0.15 s from there

NAP_PLUGIN = '''
import time
from dsh import hookimpl

@hookimpl
def register_tools(register):
    def nap(ms: int) -> str:
        """Sleep for ms milliseconds."""
        time.sleep(ms / 1000)
        return f"napped {ms} ms"
    register(nap)
'''


def _script(rng: random.Random) -> dict[str, Any]:
    """4–6 steps, each with 1–3 (concurrent) calls of ``nap``, then a final answer."""
    responses: list[dict[str, Any]] = []
    for step in range(rng.randint(4, 6)):
        calls = [{"name": "nap", "arguments": {"ms": rng.randint(5, 30)}}
                 for _ in range(rng.randint(1, 3))]
        responses.append({"text": f"step {step}", "tool_calls": calls})
    responses.append({"text": "all done"})
    return {"responses": responses}


def _kill_one(env: dict[str, str], model: str, delay: float) -> dict[str, Any]:
    """Start a run, SIGKILL it ``delay`` s after its first --events line; return what it
    printed (complete lines, as bytes), its exit status and stderr."""
    proc = subprocess.Popen([sys.executable, "-m", "dsh", "run", "--events", "-m", model, "go"],
                            env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stderr is not None
    first = proc.stdout.readline()
    timer = threading.Timer(delay, proc.kill)  # a kill of an exited, unreaped child is harmless
    timer.start()
    lines = [first]
    try:
        lines += list(proc.stdout)  # until EOF: the process ended or was killed
    finally:
        timer.cancel()
        timer.join()
        err = proc.stderr.read()
        proc.wait(timeout=30)
        proc.stdout.close()
        proc.stderr.close()
    return {"lines": [ln for ln in lines if ln.endswith(b"\n")], "rc": proc.returncode,
            "stderr": err.decode(errors="replace")}


def _phase(events: list[Any]) -> str:
    """Where in the turn the process was when it died, judged from the ledger as it was left."""
    types = [e.type for e in events]
    if not types:
        return "before turn/start"
    if "turn/end" in types:
        return "after turn/end"
    if "assistant/message" not in types:
        return "before the first answer"
    calls = [c.id for e in events if e.type == "assistant/message" for c in e.tool_calls]
    logged = {e.call_id for e in events if e.type == "tool/call"}
    answered = {e.call_id for e in events if e.type == "tool/result"}
    if any(c in logged and c not in answered for c in calls):
        return "between tool/call and tool/result"
    if any(c not in answered for c in calls):
        return "between assistant/message and tool/call"
    return "at a step boundary"


def _assert_no_dangling_call(messages: list[Message], where: str) -> None:
    """Every assistant tool call is answered by a tool message before anything else follows,
    and every tool message answers a call: what providers require of a history."""
    waiting: list[str] = []
    for i, m in enumerate(messages):
        if m.role == "tool":
            assert m.tool_call_id in waiting, f"{where}: message {i} answers no open call"
            waiting.remove(m.tool_call_id)
            continue
        assert not waiting, f"{where}: calls {waiting} unanswered before message {i} ({m.role})"
        if m.role == "assistant":
            waiting = [c.id for c in m.tool_calls]
    assert not waiting, f"{where}: calls {waiting} left dangling"


def test_sigkill_at_random_points_never_loses_or_corrupts_the_ledger(tmp_path: Path) -> None:
    plugins = tmp_path / "plugins"
    plugins.mkdir()
    (plugins / "dshkill_nap.py").write_text(NAP_PLUGIN)
    config = tmp_path / "dsh.toml"
    config.write_text('autoload = false\nload = ["dshkill_nap"]\n')
    env = {k: v for k, v in os.environ.items() if k not in ("NO_COLOR", "DSH_LOAD_PLUGINS")}
    env.update(DSH_CONFIG=str(config), PYTHONPATH=str(plugins))
    sessions = Path(env["DSH_HOME"]) / "sessions"

    rng = random.Random(SEED)
    jobs = []
    for i in range(RUNS):
        path = tmp_path / f"script{i}.json"
        path.write_text(json.dumps(_script(rng)))
        jobs.append((f"scripted:{path}", rng.uniform(0.0, MAX_DELAY)))
    with ThreadPoolExecutor(max_workers=WORKERS) as pool:
        runs = list(pool.map(lambda job: _kill_one(env, *job), jobs))

    # The resumed request is captured by a request wrapper in the resuming app.
    seen: list[Any] = []

    @hookimpl(wrapper=True)
    def request(call):  # type: ignore[no-untyped-def]
        seen.append(call.request)
        return (yield)

    import types

    recorder = types.ModuleType("dshkill_request_recorder")
    recorder.request = request  # type: ignore[attr-defined]
    sys.modules[recorder.__name__] = recorder
    try:
        app = App(config_from_dict({"autoload": False, "load": [recorder.__name__],
                                    "sessions_dir": str(sessions)}))
        store = JsonlStore(sessions)
        phases: collections.Counter[str] = collections.Counter()
        killed = interrupted = torn = 0
        for i, run in enumerate(runs):
            where = f"run {i} (seed {SEED}, kill after {jobs[i][1] * 1000:.0f} ms)"
            head = json.loads(run["lines"][0]) if run["lines"] else {}
            assert head.get("type") == "session", f"{where}: no session line: {run}"
            sid = head["session"]
            assert run["rc"] in (0, -9), f"{where}: exit {run['rc']}: {run['stderr']}"
            assert "Traceback" not in run["stderr"], f"{where}: {run['stderr']}"
            killed += run["rc"] == -9
            # 1. Every persistent event printed is in the ledger, byte for byte, in order.
            printed = [ln for ln in run["lines"] if b'"seq":' in ln and ln.startswith(b'{"v":')]
            raw = (sessions / f"{sid}.jsonl").read_bytes()
            torn += bool(raw) and not raw.endswith(b"\n")
            on_disk = raw.splitlines(keepends=True)
            assert on_disk[:len(printed)] == printed, f"{where}: printed events missing"
            # 2. It loads: reading skips a torn tail, opening repairs whatever the kill left.
            before = store.read(sid)
            assert len(before) >= len(printed), where
            phase = _phase(before)
            phases[phase] += 1
            open_calls = {c.id for e in before if e.type == "assistant/message"
                          for c in e.tool_calls} - {e.call_id for e in before
                                                    if e.type == "tool/result"}
            with store.open(sid) as ledger:
                assert not ledger.projection.pending and not ledger.projection.turn_open, where
            repaired = store.read(sid)
            fixed = [e for e in repaired[len(before):] if e.type == "tool/result"]
            assert {e.call_id for e in fixed} == open_calls, where
            assert all(e.status == "interrupted" for e in fixed), where
            interrupted += len(fixed)
            # 3. It resumes, and the next request has no dangling tool call.
            seen.clear()
            result = app.run("next", model="echo", session=sid)
            assert (result.outcome, result.output) == ("completed", "next"), where
            (req,) = seen
            messages = list(req.messages)
            _assert_no_dangling_call(messages, where)
            events = store.read(sid)
            assert messages == list(derive_messages(events))[:-1], where  # C3 after resume
            assert events[-1].type == "turn/end" and events[-1].outcome == "completed", where
            assert [e.seq for e in events] == list(range(len(events))), where
    finally:
        sys.modules.pop(recorder.__name__, None)

    summary = f"phases {dict(phases)}, killed {killed}/{RUNS}, interrupted results " \
              f"{interrupted}, torn tails {torn}"
    print(summary)
    # The kills really landed inside the run, and inside tool calls in particular.
    assert killed >= RUNS // 2, summary
    assert phases["between tool/call and tool/result"] >= 20, summary
    assert phases["before the first answer"] + phases["before turn/start"] >= 1, summary
    assert phases["at a step boundary"] >= 1, summary
    assert interrupted >= 20, summary
