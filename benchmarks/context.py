"""Compaction at scale: the per-step cost stays flat, resume stays fast, masking is free.

    python benchmarks/context.py [--k 10000] [--every 100] [--events 100000]

Prints, measured in one run:

* CPU µs per step around step 10 and around step k of one long tool-calling turn whose
  history is compacted every ``--every`` steps (by a strategy plugin that replaces the older
  part with a fixed summary: no model call, so what is measured is the runtime's own work —
  the threshold check, the ``context/compacted`` event, the projection applying it), and
  their ratio (target ≤ 1.2);
* the same turn's number of compactions and model requests (masking and this strategy make
  no model call: requests == steps);
* the built-in observation masking on the same loop: compactions, requests, CPU µs per step;
* load + derive the next request of a 100,000-event session holding a compaction every
  1,000 events, in a fresh process (target ≤ 0.5 s).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
import tempfile
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks._common import bench_app  # noqa: E402
from benchmarks._common import tmpdir  # noqa: E402
from benchmarks._common import tool_loop_script  # noqa: E402
from benchmarks.resume import CHILD as RESUME  # noqa: E402
from dsh.hookspecs import hookimpl  # noqa: E402
from dsh.llm.builtin import ScriptedModel  # noqa: E402

#: Tokens a step of the benchmark's tool loop adds (estimated), to place the threshold.
STEP_TOKENS = 15


@hookimpl
def compact_context(request: Any) -> Any:
    from dsh.core.messages import Message
    from dsh.run.compaction import Compaction

    if request.strategy != "keep-recent":
        return None
    msgs = request.messages
    end = len(msgs) - 10
    while end > 0 and msgs[end].role != "assistant":
        end -= 1
    return Compaction(start=0, end=end, replacement=(
        Message(role="user", content="[summary of the earlier steps]"),), strategy="keep-recent")


def blob(x: int) -> str:
    """A tool whose output is worth masking.

    :param x: ignored
    """
    return "line of output\n" * 30


def long_turn(steps: int, strategy: str, window: int) -> tuple[list[float], dict[str, int]]:
    marks: list[float] = []

    @hookimpl
    def pre_step(step: Any) -> None:
        marks.append(time.process_time())

    @hookimpl
    def register_tools(register: Any) -> None:
        register(blob)

    app = bench_app(tmpdir(), extra={"pre_step": pre_step, "compact_context": compact_context})
    app.config.load.append("dsh_bench_blob")
    import types

    mod = types.ModuleType("dsh_bench_blob")
    mod.register_tools = register_tools  # type: ignore[attr-defined]
    sys.modules["dsh_bench_blob"] = mod
    agent = app.agent(model="echo")
    script = tool_loop_script(steps)
    if strategy == "mask":
        script = [{"tool_calls": [{"name": "blob", "arguments": {"x": 1}}]}] * (steps - 1) + [
            {"text": "done"}]
    agent._model = ScriptedModel("", {"responses": script})
    agent.compaction = strategy
    agent.context_window = window
    gc.collect()
    with app.open_session(agent) as s:
        result = s.send("go")
        path = s.ledger.path
    assert result.outcome == "completed" and result.steps == steps, result.reason
    counts = {"compactions": 0, "requests": 0}
    with open(path) as f:  # type: ignore[arg-type]
        for line in f:
            t = json.loads(line)["type"]
            if t == "context/compacted":
                counts["compactions"] += 1
            elif t == "assistant/message":
                counts["requests"] += 1
    return marks, counts


def window_cost(marks: list[float], start: int, width: int) -> float:
    return (marks[start + width] - marks[start]) / width * 1e6


def build_compacted(directory: str, events: int, every: int) -> str:
    from pathlib import Path

    from dsh.core.messages import Message
    from dsh.core.messages import Usage
    from dsh.ledger.events import AssistantMessage
    from dsh.ledger.events import ContextCompacted
    from dsh.ledger.events import StepEnded
    from dsh.ledger.events import StepStarted
    from dsh.ledger.events import TurnEnded
    from dsh.ledger.events import TurnStarted
    from dsh.ledger.events import UserMessage
    from dsh.ledger.store import JsonlStore

    store = JsonlStore(Path(directory), fsync="never")
    with store.create() as ledger:
        turn = 0
        last = 0
        while ledger.projection.seq + 1 < events - 8:
            turn += 1
            ledger.append(TurnStarted, turn=turn, agent="default", model="openai:gpt-4o-mini",
                          system="You are a careful assistant." if turn == 1 else None)
            ledger.append(StepStarted, turn=turn, step=0)
            ledger.append(UserMessage, text=f"Question {turn}: what do the notes say?")
            if every and ledger.projection.seq - last >= every:
                last = ledger.projection.seq
                n = len(ledger.projection)
                ledger.append(ContextCompacted, start=0, end=n - 1, strategy="summarize",
                              reason="threshold", tokens_before=9000, tokens_after=900,
                              messages=(Message(role="user",
                                                content=f"<summary>turns up to {turn}</summary>"),))
            ledger.append(AssistantMessage, text=f"The notes of {turn} say two lines.",
                          usage=Usage(input_tokens=180, output_tokens=12), model="gpt-4o-mini")
            ledger.append(StepEnded, turn=turn, step=0)
            ledger.append(TurnEnded, turn=turn, outcome="completed")
        return ledger.session_id


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--k", type=int, default=10_000, help="session length for the growth ratio")
    ap.add_argument("--every", type=int, default=100, help="steps between compactions")
    ap.add_argument("--window", type=int, default=500, help="steps averaged at each point")
    ap.add_argument("--events", type=int, default=100_000, help="events in the resumed session")
    args = ap.parse_args()

    window = int(args.every * STEP_TOKENS / 0.8)
    marks, counts = long_turn(args.k + args.window + 1, "keep-recent", window)
    early, late = window_cost(marks, 10, args.window), window_cost(marks, args.k, args.window)
    print(f"compacting every ~{args.every} steps: {counts['compactions']} compactions, "
          f"{counts['requests']} model requests for {len(marks)} steps")
    print(f"cpu per step at k=10: {early:.1f} us; at k={args.k}: {late:.1f} us")
    print(f"growth ratio step(k={args.k}) / step(k=10): {late / early:.2f}  (target <= 1.2)")

    n = 2_000
    marks, counts = long_turn(n, "mask", n * 60)
    print(f"observation masking, {n} steps: {counts['compactions']} compactions, "
          f"{counts['requests']} model requests (no extra call: requests == steps), "
          f"{(marks[-1] - marks[0]) / (n - 1) * 1e6:.1f} us/step")

    directory = tempfile.mkdtemp(prefix="dsh-context-")
    compacted = build_compacted(directory, args.events, 1_000)
    plain = build_compacted(directory, args.events, 0)

    def resume(sid: str) -> dict[str, Any]:
        runs = [json.loads(subprocess.run([sys.executable, "-c", RESUME, directory, sid],
                                          check=True, capture_output=True, text=True).stdout)
                for _ in range(3)]
        return min(runs, key=lambda r: r["seconds"])

    with_c, without = resume(compacted), resume(plain)
    print(f"resume: {with_c['events']:,} events with {with_c['compactions']} compactions, "
          f"{with_c['messages']} messages in the next request: {with_c['seconds']:.3f} s "
          "(best of 3; target <= 0.5 s)")
    ratio = with_c["seconds"] / without["seconds"]
    print(f"resume of the same session without compactions ({without['messages']:,} "
          f"messages): {without['seconds']:.3f} s; ratio {ratio:.2f}")


if __name__ == "__main__":
    main()
