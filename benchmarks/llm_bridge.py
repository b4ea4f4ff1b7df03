"""What the llm bridge (plugins/dsh-llm) costs: at start-up when unused, and when used.

    python benchmarks/llm_bridge.py [--runs 10] [--requests 200]

Needs dsh-llm, llm and llm-echo installed (as .ci/run installs them). Measures, interleaved,
with the same interpreter, a temporary DSH_HOME and a temporary LLM_USER_PATH:

1. wall time of one-shot runs (median of ``--runs``):
   ``dsh run -m echo hi`` with only dsh-llm loaded (``DSH_LOAD_PLUGINS=llm``) and with no
   plugin at all (``DSH_LOAD_PLUGINS=``): what merely having the bridge installed costs;
   ``dsh run -m llm:echo hi``: the bridge used; ``llm -m echo hi`` (llm's own CLI) and
   ``python -c pass`` for reference;
2. the import cost when used, in fresh interpreters: ``import llm``, and
   ``llm.get_model("echo")`` (llm loads its plugins and instantiates every registered model);
3. CPU per request in-process, through dsh's transport (``transport.send``) with the
   ``llm:echo`` adapter: a one-message request and a 100-message history with tool calls,
   which the bridge translates into llm's Conversation/Prompt on every request.

``LLM_LOAD_PLUGINS`` is left as found: llm loads every installed llm plugin, as a user's
would (set it to ``llm-echo`` to measure the bridge without other plugins' imports).
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def dsh_command() -> list[str]:
    script = Path(sys.executable).with_name("dsh")
    return [str(script)] if script.exists() else [sys.executable, "-m", "dsh"]


def timed(cmd: list[str], env: dict[str, str] | None = None) -> tuple[float, float]:
    """Wall time and CPU time (user + system) of one child process."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    subprocess.run(cmd, env=env, check=True, stdout=subprocess.DEVNULL,
                   stdin=subprocess.DEVNULL)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def table(title: str, rows: dict[str, list[tuple[float, float]]]) -> None:
    bare = statistics.median(c for _, c in rows["python -c pass"])
    print(f"| {title} | wall ms | CPU ms | CPU over `python -c pass` |")
    print("|---|---:|---:|---:|")
    for name, ts in rows.items():
        wall = statistics.median(w for w, _ in ts)
        cpu = statistics.median(c for _, c in ts)
        print(f"| `{name}` | {wall * 1e3:.1f} | {cpu * 1e3:.1f} | {(cpu - bare) * 1e3:+.1f} |")
    print()


def one_shot(runs: int) -> None:
    home = tempfile.mkdtemp(prefix="dsh-llm-bench-")
    base = {k: v for k, v in os.environ.items() if not k.startswith("DSH_")}
    base.update({"DSH_HOME": home, "XDG_CONFIG_HOME": home,
                 "LLM_USER_PATH": str(Path(home, "llm-user"))})
    dsh = dsh_command()
    cases = {
        "python -c pass": ([sys.executable, "-c", "pass"], {}),
        "dsh run -m echo hi (no plugin)": ([*dsh, "run", "-m", "echo", "hi"],
                                           {"DSH_LOAD_PLUGINS": ""}),
        "dsh run -m echo hi (dsh-llm installed)": ([*dsh, "run", "-m", "echo", "hi"],
                                                   {"DSH_LOAD_PLUGINS": "llm"}),
        "dsh run -m llm:echo hi": ([*dsh, "run", "-m", "llm:echo", "hi"],
                                   {"DSH_LOAD_PLUGINS": "llm"}),
        "llm -m echo hi (llm's CLI)": ([sys.executable, "-m", "llm", "-m", "echo", "hi"], {}),
    }
    times: dict[str, list[tuple[float, float]]] = {name: [] for name in cases}
    for cmd, extra in cases.values():  # warm the page cache
        timed(cmd, {**base, **extra})
    for _ in range(runs):
        for name, (cmd, extra) in cases.items():
            times[name].append(timed(cmd, {**base, **extra}))
    table(f"one-shot run (median of {runs})", times)


def import_cost(runs: int) -> None:
    codes = {
        "python -c pass": "pass",
        "import dsh_llm (the entry point)": "import dsh_llm",
        "import llm": "import llm",
        "import llm; llm.get_model('echo')": "import llm; llm.get_model('echo')",
        "LLMModel('echo', {}).check() (what a run pays)":
            "import dsh_llm.model as m; m.LLMModel('echo', {}).check()",
    }
    times: dict[str, list[tuple[float, float]]] = {name: [] for name in codes}
    for _ in range(runs):
        for name, code in codes.items():
            times[name].append(timed([sys.executable, "-c", code]))
    table(f"fresh interpreter (median of {runs})", times)


def per_request(requests: int) -> None:
    from dsh_llm.model import LLMModel

    from dsh.core.messages import Message
    from dsh.core.messages import ModelRequest
    from dsh.core.messages import ToolCall
    from dsh.llm.transport import send

    adapter = LLMModel("echo", {})
    adapter.check()
    short = ModelRequest(model="llm:echo", messages=[Message(role="user", content="hi")])
    history: list[Message] = []
    for i in range(25):
        history.append(Message(role="user", content=f"question {i}"))
        history.append(Message(role="assistant", content="", tool_calls=[
            ToolCall(id=f"c{i}", name="simple_eval", arguments={"expression": "1+1"})]))
        history.append(Message(role="tool", content="2", tool_call_id=f"c{i}",
                               name="simple_eval"))
        history.append(Message(role="assistant", content=f"answer {i}"))
    long = ModelRequest(model="llm:echo", messages=[*history,
                                                    Message(role="user", content="last")])
    print(f"| request through transport.send, llm:echo (best of 3 x {requests}) | CPU us |")
    print("|---|---:|")
    for name, req in (("1 message", short), (f"{len(long.messages)} messages", long)):
        best = float("inf")
        for _ in range(3):
            t0 = time.process_time()
            for _ in range(requests):
                send(req, None, model=adapter)
            best = min(best, (time.process_time() - t0) / requests)
        print(f"| {name} | {best * 1e6:.0f} |")
    print()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--requests", type=int, default=200)
    args = ap.parse_args()
    os.environ["LLM_USER_PATH"] = tempfile.mkdtemp(prefix="dsh-llm-bench-user-")
    one_shot(args.runs)
    import_cost(args.runs)
    per_request(args.requests)


if __name__ == "__main__":
    main()
