"""Resume at scale: load a 100,000-event session and derive its next request.

    python benchmarks/resume.py [--events 100000]

Builds a session of realistic events (turns of user message, assistant tool call, tool result,
final answer) on disk, then, in a fresh process, opens it the way `dsh run --session` does
(lock, read, validate every line, repair, project) and builds the next model request. Prints
the wall time and the process's peak RSS, next to a bare interpreter's, and the time as a
ratio against a floor measured in the same run (a fresh process reading the same file and
decoding every line with ``json.loads``). Targets: ≤ 1.25x the floor, ≤ 100 MiB.

With ``--state-events N`` (issue 25), N of the events are recorded-state updates
(``x/dsh.tasks/tasks``, a 5-item task list each), the child also folds the task list, and the
time is compared with a session of as many events and no state (and with the same state
session resumed without reading its task list: the fold's own share), all timed from after their
imports. The children compared import the same modules before their clocks start, as any app
that resumes has (``dsh.tasks`` is a built-in plugin: every app imports it, whatever its
sessions hold), so what differs between them is the session alone. Target: ≤ 1.10. The
children's CPU time is printed next to it: on a machine shared with other work it is the
steadier of the two. With ``--instructions`` (needs valgrind), each session's resume is also
run once under callgrind and its instructions counted, an imports-only child's subtracted: a
ratio that no other process on the machine can move (though not one of time: it does not see
memory traffic; decoding each line alone executes more instructions than decoding a MiB of
joined lines, and took less time, docs/performance.md).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

#: The process's own peak RSS. Not ``ru_maxrss``: on Linux it survives ``exec``, so a child
#: would report this benchmark's peak (it builds the sessions) whenever that is the larger.
PEAK = r"""
import resource
def peak_mib():
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
"""

CHILD = PEAK + r"""
import json, sys, time
if len(sys.argv) > 3:  # an app that resumes has imported its plugins already (dsh.tasks is
    from dsh.run.tasks import TASKS  # a built-in: every app registers it, state or none)
t0 = time.perf_counter()
from pathlib import Path
from dsh.ledger.store import JsonlStore
from dsh.core.messages import ModelRequest
if len(sys.argv) > 3 and sys.argv[3] == "imports":  # --instructions: the imports' own count
    sys.exit(0)
t1, c1 = time.perf_counter(), time.process_time()  # what follows is the resume itself
store = JsonlStore(Path(sys.argv[1]), fsync="never")
with store.open(sys.argv[2]) as ledger:
    p = ledger.projection
    request = ModelRequest(model=p.model, system=p.system, messages=p.view(), tools=p.tools,
                           options=p.options)
    n = len(request.messages)
    if len(sys.argv) > 3 and sys.argv[3] == "state":
        assert len(TASKS.read(p)) == 5
t2, c2 = time.perf_counter(), time.process_time()
rss = peak_mib()
print(json.dumps({"seconds": t2 - t0, "load_seconds": t2 - t1, "load_cpu": c2 - c1,
                  "rss_mib": rss, "messages": n, "events": p.seq + 1,
                  "compactions": p.compactions}))
"""

#: The floor, in a fresh process too: read the same file and decode every line with json.loads.
FLOOR = r"""
import json, sys, time
t0 = time.perf_counter()
with open(f"{sys.argv[1]}/{sys.argv[2]}.jsonl", "rb") as f:
    n = sum(1 for line in f if json.loads(line))
print(json.dumps({"seconds": time.perf_counter() - t0, "events": n}))
"""

BARE = PEAK + r"""
import json
print(json.dumps({"rss_mib": peak_mib()}))
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


def child(directory: str, sid: str, state: bool | None, fold: bool = True) -> dict[str, float]:
    """One resume in a fresh process; ``state`` (True or False): import the task list's key
    first and, with ``fold`` and ``state``, read it (without: the same process, the state left
    unread); ``None``: import nothing first (the first figure's resume)."""
    flag = [] if state is None else ["state" if state and fold else "nofold"]
    out = subprocess.run([sys.executable, "-c", CHILD, directory, sid, *flag],
                         check=True, capture_output=True, text=True)
    return json.loads(out.stdout)


def instructions(directory: str, sid: str, flag: str) -> int:
    """Instructions the child executes with ``flag`` (``state``, ``nofold`` or ``imports``),
    counted by valgrind's callgrind: the same on every run, whatever else the machine does."""
    out = subprocess.run(["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null",
                          sys.executable, "-c", CHILD, directory, sid, flag],
                         check=True, capture_output=True, text=True,
                         env={**os.environ, "PYTHONHASHSEED": "0"})
    counts = [line.split()[-1] for line in out.stderr.splitlines() if "Collected :" in line]
    if not counts:
        raise SystemExit(f"no instruction count in valgrind's output:\n{out.stderr[-2000:]}")
    return int(counts[-1])


def floor(directory: str, sid: str) -> float:
    out = subprocess.run([sys.executable, "-c", FLOOR, directory, sid], check=True,
                         capture_output=True, text=True)
    return json.loads(out.stdout)["seconds"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--events", type=int, default=100_000)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--state-events", type=int, default=0,
                    help="also measure a session with this many recorded-state updates")
    ap.add_argument("--instructions", action="store_true",
                    help="with --state-events, also count the instructions of one resume of "
                         "each session under valgrind (a few minutes; needs valgrind)")
    args = ap.parse_args()
    if args.instructions and not (args.state_events and shutil.which("valgrind")):
        ap.error("--instructions needs --state-events and valgrind on PATH")
    plain = tempfile.mkdtemp(prefix="dsh-resume-")
    sid = build(plain, args.events)
    size = os.path.getsize(os.path.join(plain, f"{sid}.jsonl"))
    if args.state_events:
        stated = tempfile.mkdtemp(prefix="dsh-resume-")
        sid_s = build(stated, args.events, args.state_events)
    results, floors, without, with_state, unfolded = [], [], [], [], []
    for _ in range(args.runs):  # interleaved: dsh, floor[, dsh without and with state], dsh…
        results.append(child(plain, sid, None))
        floors.append(floor(plain, sid))
        if args.state_events:
            without.append(child(plain, sid, False))
            with_state.append(child(stated, sid_s, True))
            unfolded.append(child(stated, sid_s, True, fold=False))
    best = min(results, key=lambda r: r["seconds"])
    bare = json.loads(subprocess.run([sys.executable, "-c", BARE], check=True,
                                     capture_output=True, text=True).stdout)
    print(f"session: {best['events']:,} events, {size / 2**20:.1f} MiB on disk, "
          f"{best['messages']:,} messages in the next request")
    pairs = sorted(r["seconds"] / f for r, f in zip(results, floors, strict=True))
    print(f"load + derive next request: {best['seconds']:.3f} s (best of {args.runs}); "
          f"floor (json.loads of every line) {min(floors):.3f} s; ratio "
          f"{best['seconds'] / min(floors):.2f}x, median of the {len(pairs)} side-by-side "
          f"pairs {pairs[len(pairs) // 2]:.2f}x  (target <= 1.25x)")
    print(f"peak RSS: {best['rss_mib']:.1f} MiB (bare interpreter {bare['rss_mib']:.1f} MiB; "
          "target <= 100 MiB)")
    if args.state_events:
        # Imports are left out on both sides, and both have imported the same modules
        plain_load = min(r["load_seconds"] for r in without)
        ws = min(with_state, key=lambda r: r["load_seconds"])
        ratio = ws["load_seconds"] / plain_load
        print(f"with {args.state_events:,} state events of {ws['events']:,}: "
              f"{ws['load_seconds']:.3f} s / {plain_load:.3f} s without, imports excluded "
              f"= {ratio:.2f} x (target <= 1.10)")
        # CPU time is less disturbed than wall time by other processes on a loaded machine
        cpu, cpu_s = (min(r["load_cpu"] for r in rs) for rs in (without, with_state))
        print(f"  CPU (best of {args.runs} each): {cpu_s:.3f} s / {cpu:.3f} s = "
              f"{cpu_s / cpu:.2f} x")
        # On a machine whose speed drifts from one run to the next, the runs made side by
        # side are the fairer comparison: the median of the per-pair ratios
        pairs = sorted(s["load_cpu"] / p["load_cpu"]
                       for s, p in zip(with_state, without, strict=True))
        print(f"  CPU, median of the {len(pairs)} side-by-side pairs' ratios: "
              f"{pairs[len(pairs) // 2]:.2f} x (lowest {pairs[0]:.2f}, highest {pairs[-1]:.2f})")
        # The state machinery's own share: the same session, its task list read or not
        cpu_u = min(r["load_cpu"] for r in unfolded)
        print(f"  the state session with its task list folded / not read, CPU: {cpu_s:.3f} s / "
              f"{cpu_u:.3f} s = {cpu_s / cpu_u:.2f} x")
    if args.instructions:
        # What the resume itself executes: each child's count less an imports-only child's
        base = instructions(plain, sid, "imports")
        n_plain = instructions(plain, sid, "nofold") - base
        n_state = instructions(stated, sid_s, "state") - base
        print(f"  instructions (callgrind, imports subtracted): {n_state / 1e6:,.0f} M / "
              f"{n_plain / 1e6:,.0f} M = {n_state / n_plain:.3f} x")

if __name__ == "__main__":
    main()
