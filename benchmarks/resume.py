"""Resume at scale: load a 100,000-event session and derive its next request.

    python benchmarks/resume.py [--events 100000]

Builds a session of realistic events (turns of user message, assistant tool call, tool result,
final answer) on disk, then, in a fresh process, opens it the way `dsh run --session` does
(lock, read, validate every line, repair, project) and builds the next model request. Prints
the wall time and the process's peak RSS, next to a bare interpreter's. Targets: ≤ 0.5 s,
≤ 100 MiB.

With ``--state-events N`` (issue 25), N of the events are recorded-state updates
(``x/dsh.tasks/tasks``, a 5-item task list each), the child also folds the task list, and the
time is compared with a session of as many events and no state. Target: ≤ 1.10.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

CHILD = r"""
import json, resource, sys, time
if len(sys.argv) > 3:  # an app that resumes has imported its plugins already
    from dsh.run.tasks import TASKS
t0 = time.perf_counter()
from pathlib import Path
from dsh.ledger.store import JsonlStore
from dsh.core.messages import ModelRequest
store = JsonlStore(Path(sys.argv[1]), fsync="never")
with store.open(sys.argv[2]) as ledger:
    p = ledger.projection
    request = ModelRequest(model=p.model, system=p.system, messages=p.view(), tools=p.tools,
                           options=p.options)
    n = len(request.messages)
    if len(sys.argv) > 3:
        assert len(TASKS.read(p)) == 5
elapsed = time.perf_counter() - t0
rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print(json.dumps({"seconds": elapsed, "rss_mib": rss, "messages": n, "events": p.seq + 1,
                  "compactions": p.compactions}))
"""

BARE = r"""
import json, resource
print(json.dumps({"rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""


def build(directory: str, events: int, state_events: int = 0) -> str:
    from pathlib import Path

    from dsh.core.messages import ToolCall
    from dsh.core.messages import ToolSpec
    from dsh.core.messages import Usage
    from dsh.ledger.events import AssistantMessage
    from dsh.ledger.events import PluginEvent
    from dsh.ledger.events import StepEnded
    from dsh.ledger.events import StepStarted
    from dsh.ledger.events import ToolCalled
    from dsh.ledger.events import ToolReturned
    from dsh.ledger.events import TurnEnded
    from dsh.ledger.events import TurnStarted
    from dsh.ledger.events import UserMessage
    from dsh.ledger.store import JsonlStore

    store = JsonlStore(Path(directory), fsync="never")
    tools = (ToolSpec(name="read_file", description="Read a file.",
                      parameters={"type": "object", "properties": {"path": {"type": "string"}},
                                  "required": ["path"]}),)
    with store.create() as ledger:
        turn = 0
        written = 0
        tasks = {"tasks": [{"content": f"task {i}", "status": "pending"} for i in range(5)]}
        while ledger.projection.seq + 1 < events - 11:
            turn += 1
            # state updates spread evenly: after this turn, about state_events * seq / events
            while written * events < state_events * (ledger.projection.seq + 1):
                ledger.append(PluginEvent, plugin="dsh.tasks", name="tasks", data=tasks)
                written += 1
            ledger.append(TurnStarted, turn=turn, agent="default", model="openai:gpt-4o-mini",
                          system="You are a careful assistant." if turn == 1 else None,
                          tools=tools if turn == 1 else None)
            ledger.append(StepStarted, turn=turn, step=0)
            ledger.append(UserMessage, text=f"Please summarise notes/{turn}.txt for me.")
            call = ToolCall(id=f"call_{turn}", name="read_file",
                            arguments={"path": f"notes/{turn}.txt"})
            ledger.append(AssistantMessage, text="", tool_calls=(call,),
                          usage=Usage(input_tokens=120, output_tokens=18),
                          tool_call_source="native", model="gpt-4o-mini")
            ledger.append(ToolCalled, call_id=call.id, name="read_file", arguments=call.arguments)
            ledger.append(ToolReturned, call_id=call.id, name="read_file",
                          output="line one of the notes\nline two of the notes\n" * 3,
                          duration_ms=0.4)
            ledger.append(StepEnded, turn=turn, step=0)
            ledger.append(StepStarted, turn=turn, step=1)
            ledger.append(AssistantMessage, text=f"The notes of {turn} say two lines.",
                          usage=Usage(input_tokens=180, output_tokens=12), model="gpt-4o-mini")
            ledger.append(StepEnded, turn=turn, step=1)
            ledger.append(TurnEnded, turn=turn, outcome="completed")
        return ledger.session_id


def measure(events: int, runs: int, state_events: int = 0) -> tuple[dict[str, float], int]:
    directory = tempfile.mkdtemp(prefix="dsh-resume-")
    sid = build(directory, events, state_events)
    size = os.path.getsize(os.path.join(directory, f"{sid}.jsonl"))
    results = []
    for _ in range(runs):
        extra = ["state"] if state_events else []
        out = subprocess.run([sys.executable, "-c", CHILD, directory, sid, *extra], check=True,
                             capture_output=True, text=True)
        results.append(json.loads(out.stdout))
    return min(results, key=lambda r: r["seconds"]), size


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--events", type=int, default=100_000)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--state-events", type=int, default=0,
                    help="also measure a session with this many recorded-state updates")
    args = ap.parse_args()
    best, size = measure(args.events, args.runs)
    bare = json.loads(subprocess.run([sys.executable, "-c", BARE], check=True,
                                     capture_output=True, text=True).stdout)
    print(f"session: {best['events']:,} events, {size / 2**20:.1f} MiB on disk, "
          f"{best['messages']:,} messages in the next request")
    print(f"load + derive next request: {best['seconds']:.3f} s (best of {args.runs}; "
          "target <= 0.5 s)")
    print(f"peak RSS: {best['rss_mib']:.1f} MiB (bare interpreter {bare['rss_mib']:.1f} MiB; "
          "target <= 100 MiB)")
    if args.state_events:
        with_state, _ = measure(args.events, args.runs, args.state_events)
        ratio = with_state["seconds"] / best["seconds"]
        print(f"with {args.state_events:,} state events of {with_state['events']:,}: "
              f"{with_state['seconds']:.3f} s, {ratio:.2f} x without (target <= 1.10)")


if __name__ == "__main__":
    main()
