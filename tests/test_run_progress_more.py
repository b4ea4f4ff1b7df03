"""``dsh run`` on a terminal shows its sub-agents' work and a compaction as it starts
(docs/cli.md, "What a run shows on a terminal"): a sub-agent's tool calls and results are
lines on stderr, indented and named by the sub-agent; a compaction says
``compacting the history…`` before it runs. ``-q`` leaves them out, a stderr that is not a
terminal gets exactly what it got before, and ``--events`` carries the run's own session only
(plus the ``context/compacting`` live event).

Driven on a real pseudo-terminal (pexpect) with stdout redirected to a file inside the pty's
shell, the models scripted; sub-agents run side by side in a step's worker threads.
"""

from __future__ import annotations

import json
import re
import threading
from pathlib import Path
from typing import Any

import pytest

from tests.test_run_progress import YES_NOTE
from tests.test_run_progress import Env

pytest.importorskip("pexpect", reason="pexpect is in the test extra: pip install -e '.[test]'")
pytest.importorskip("dsh_shell", reason="dsh-shell is installed by .ci/run")


class Agents(Env):
    """:class:`Env` with agents of their own scripted models: ``lead`` (the run's) and the
    sub-agents it may ask."""

    def agents(self, scripts: dict[str, list[dict[str, Any]]],
               subagents: dict[str, list[str]]) -> None:
        self.configure({"text": "unused"})
        lines = self.config.read_text().splitlines()
        lines.insert(0, 'agent = "lead"')
        for name, responses in scripts.items():
            script = self.tmp / f"{name}.json"
            script.write_text(json.dumps({"responses": responses}))
            lines += [f"[agents.{name}]", f'model = "scripted:{script}"']
            if name in subagents:
                lines.append(f"subagents = {json.dumps(subagents[name])}")
        self.config.write_text("\n".join(lines) + "\n")


@pytest.fixture
def env(tmp_path: Path) -> Agents:
    return Agents(tmp_path)


def _screen(seen: str) -> list[str]:
    """Each line as it stays on screen (the status line before it erased: ``\\r\\x1b[K``)."""
    return [line.split("\r")[-1].replace("\x1b[K", "") for line in seen.split("\r\n")]


def _ask(*prompts: str, name: str = "helper") -> dict[str, Any]:
    return {"tool_calls": [{"name": f"ask_{name}", "arguments": {"prompt": p}}
                           for p in prompts]}


def _command(command: str) -> dict[str, Any]:
    return {"tool_calls": [{"name": "run_command", "arguments": {"command": command}}]}


def test_sub_agents_running_side_by_side_show_their_tool_calls(env: Agents) -> None:
    env.agents({"lead": [_ask("first", "second"), {"text": "all done"}],
                "helper": [_command("echo from-helper"), {"text": "helper done"}]},
               {"lead": ["helper"]})
    lines = _screen(env.transcript("--yes", "go"))
    assert '→ ask_helper {"prompt":"first"}' in lines, lines
    assert '→ ask_helper {"prompt":"second"}' in lines, lines
    # each sub-agent's call and its end, whole lines, indented and named
    assert lines.count("  helper: → run_command echo from-helper") == 2, lines
    ends = [line for line in lines if line.startswith("  helper: ← ok ")]
    assert len(ends) == 2 and all(line.endswith(" ms") for line in ends), lines
    # the lead's two calls ran side by side: their ends name the tool, after the helpers'
    lead_ends = [i for i, line in enumerate(lines) if line.startswith("← ask_helper ok ")]
    assert len(lead_ends) == 2, lines
    helper_calls = [i for i, line in enumerate(lines) if line.startswith("  helper: → ")]
    assert max(helper_calls) < max(lead_ends)
    assert env.out.read_text() == "all done\n"

    # -q: none of the lines
    quiet = env.transcript("-q", "--yes", "go")
    assert "helper:" not in quiet and "→ " not in quiet
    assert env.out.read_text() == "all done\n"

    # stderr not a terminal: exactly what dsh printed before
    piped = env.piped("--yes", "go")
    assert piped.returncode == 0, piped.stderr
    assert (piped.stdout, piped.stderr) == ("all done\n", YES_NOTE + "\n")


def test_a_sub_agents_sub_agent_is_indented_one_level_more(env: Agents) -> None:
    env.agents({"lead": [_ask("dig"), {"text": "lead done"}],
                "helper": [_ask("deeper", name="scout"), _command("echo helper-cmd"),
                           {"text": "helper done"}],
                "scout": [_command("echo scout-cmd"), {"text": "scout done"}]},
               {"lead": ["helper"], "helper": ["scout"]})
    lines = _screen(env.transcript("--yes", "go"))
    nested = ['→ ask_helper {"prompt":"dig"}',
              '  helper: → ask_scout {"prompt":"deeper"}',
              "    scout: → run_command echo scout-cmd",
              "  helper: → run_command echo helper-cmd"]
    at = [lines.index(line) for line in nested]  # ValueError names a missing line
    assert at == sorted(at), lines
    assert any(line.startswith("    scout: ← ok ") for line in lines), lines
    assert env.out.read_text() == "lead done\n"


def test_events_carry_the_runs_own_session_only(env: Agents) -> None:
    env.agents({"lead": [_ask("first"), {"text": "all done"}],
                "helper": [_command("echo from-helper"), {"text": "helper done"}]},
               {"lead": ["helper"]})
    # stderr a terminal: the helper is watched (and so observed) for its lines there, and
    # --events on stdout still has the lead's session alone; stderr a pipe: the same lines
    seen = env.transcript("--yes", "--events", "go")
    assert "  helper: → run_command echo from-helper" in _screen(seen)
    piped = env.piped("--yes", "--events", "go")
    assert piped.returncode == 0, piped.stderr
    for stdout in (env.out.read_text(), piped.stdout):
        events = [json.loads(line) for line in stdout.splitlines()]
        own = events[0]["session"]
        assert {e["session"] for e in events if "seq" in e} == {own}
        assert "from-helper" not in stdout  # the helper's command: its own session's
        result = next(e for e in events if e["type"] == "tool/result")
        assert result["name"] == "ask_helper" and result["output"] == "helper done"
        assert events[-1]["type"] == "result" and events[-1]["output"] == "all done"
        assert [e["type"] for e in events if "seq" not in e and e["type"] in (
            "tools/pre-execute", "agent/request")] == [
            "agent/request", "tools/pre-execute", "agent/request"]  # the lead's alone


def test_a_compaction_says_so_when_it_starts(env: Agents) -> None:
    env.configure(_command("seq 1 300"), _command("seq 1 300"), {"text": "done"},
                  top=('compaction = "truncate"', "context_window = 1500"))
    seen = env.transcript("--yes", "go")
    starts = [m.start() for m in re.finditer(
        r"dsh: compacting the history \(truncate, \d+ tokens\)…", seen)]
    ends = [m.start() for m in re.finditer(
        r"dsh: compacted the history: \d+ → \d+ tokens \(truncate, threshold\)", seen)]
    assert starts and ends, seen
    assert starts[0] < ends[0]
    assert env.out.read_text() == "done\n"

    quiet = env.transcript("-q", "--yes", "go")
    assert "compacting" not in quiet and "compacted" not in quiet

    piped = env.piped("--yes", "go")
    assert (piped.stdout, piped.stderr) == ("done\n", YES_NOTE + "\n")

    # --events: the start is a live event, before the context/compacted it led to
    piped = env.piped("--yes", "--events", "go")
    assert piped.returncode == 0, piped.stderr
    events = [json.loads(line) for line in piped.stdout.splitlines()]
    kinds = [e["type"] for e in events]
    start = kinds.index("context/compacting")
    assert start < kinds.index("context/compacted")
    data = events[start]
    assert data["strategy"] == "truncate" and data["reason"] == "threshold"
    assert data["window"] == 1500 and data["tokens"] > 1500 * 0.5
    assert "seq" not in data  # live: never in the ledger
    ledger = Path(env.tmp / "sessions").rglob("*.jsonl")
    assert not any("context/compacting" in p.read_text() for p in ledger)


class _Event:
    def __init__(self, type_: str, session: str, **fields: Any) -> None:
        self.type, self.session = type_, session
        self.__dict__.update(fields)


def test_the_work_log_takes_concurrent_sub_agents_one_event_at_a_time() -> None:
    """Two sub-agents whose calls have the same id, from two threads at once: every line
    whole, each result matched to its own session's call (never named as side by side)."""
    from dsh.cli.progress import WorkLog

    written: list[str] = []
    inside = threading.Event()
    overlap: list[bool] = []

    def note(line: str) -> None:
        overlap.append(inside.is_set())
        inside.set()
        written.append(line)
        inside.clear()

    log = WorkLog(note)
    log.session = "lead"
    barrier = threading.Barrier(2)

    def agent(name: str) -> None:
        barrier.wait()
        for i in range(200):
            log.on_subagent(_Event("tool/call", name, call_id="c1", name="read_file",
                                   arguments={"path": f"{name}-{i}"}), name, 1)
            log.on_subagent(_Event("tool/result", name, call_id="c1", name="read_file",
                                   status="ok", output="", duration_ms=1.0), name, 1)

    threads = [threading.Thread(target=agent, args=(n,)) for n in ("alpha", "beta")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not any(overlap)
    for name in ("alpha", "beta"):
        mine = [line for line in written if line.startswith(f"  {name}: ")]
        assert mine[0::2] == [f"  {name}: → read_file {name}-{i}" for i in range(200)]
        assert mine[1::2] == [f"  {name}: ← ok 1 ms"] * 200


def test_lines_wait_while_a_question_is_on_the_terminal() -> None:
    """A sub-agent's line that comes while another one's approval question waits for its
    answer is held (it would land inside the question or its typed answer) and written once
    the question is answered, before the next line."""
    from dsh.cli.progress import WorkLog
    from dsh.cli.status import status_paused

    written: list[str] = []
    log = WorkLog(written.append)
    log.session = "lead"
    event = _Event("tool/call", "two", call_id="c1", name="read_file", arguments={"path": "b"})
    with status_paused():  # a question is asked on the terminal
        log.on_subagent(event, "two", 1)
        assert written == []
    log.on_subagent(_Event("tool/result", "two", call_id="c1", name="read_file", status="ok",
                           output="", duration_ms=1.0), "two", 1)
    assert written == ["  two: → read_file b", "  two: ← ok 1 ms"]
    with status_paused():
        log.on_subagent(event, "two", 1)
    log.flush()  # the run's end writes what is left
    assert written[2:] == ["  two: → read_file b"]
