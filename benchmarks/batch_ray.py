"""``dsh batch --executor ray`` (plugins/dsh-ray): per-task overhead beside the local executor.

    python benchmarks/batch_ray.py [--tasks 60] [--workers 1,4] [--num-cpus 2]

One local Ray is started in this process (``ray.init``, not timed) and every batch runs
in-process through :func:`dsh.batch.runner.run_batch` (the executor joins the running Ray). Tasks
are the overhead tasks of benchmarks/batch.py: 3 steps of a scripted model with no delay and
a trivial tool, so what is measured is what each executor adds per task:

* **local**: the built-in executor (threads in this process);
* **ray**: each task a Ray task on a worker (its App built once per worker process and
  reused), the budget an actor (a reserve or add per step and request: a round trip each);
* **floor**: Ray's own latency, one trivial task at a time (``ray.get(f.remote())``), and
  one actor call at a time (what each budget reservation costs).

A warm-up batch of the same size runs first for each executor (Ray's worker processes start,
import dsh and build their App there, once).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks._common import tmpdir  # noqa: E402

TOOLS = '''
import dsh


def noop(x: int) -> int:
    """Return x."""
    return x


@dsh.hookimpl
def register_tools(register):
    register(noop)
'''


def setup(tmp: str) -> str:
    """The tool module (the workers import it too: ``PYTHONPATH``) and the model."""
    (Path(tmp) / "dsh_bench_ray_tools.py").write_text(TOOLS)
    sys.path.insert(0, tmp)
    call = {"tool_calls": [{"name": "noop", "arguments": {"x": 1}}]}
    path = Path(tmp) / "script.json"
    path.write_text(json.dumps({"responses": [call, call, {"text": "done"}]}))
    return f"scripted:{path}"


def once(model: str, n: int, workers: int, executor: str) -> float:
    """Seconds for ``n`` tasks through ``executor``, a fresh app and store."""
    from dsh.batch.runner import run_batch
    from dsh.config.loader import config_from_dict
    from dsh.run.app import App

    sub = tmpdir()
    app = App(config_from_dict({"autoload": False, "load": ["dsh_bench_ray_tools", "dsh_ray"],
                                "sessions_dir": str(Path(sub) / "sessions"),
                                "max_steps": 1000,
                                "plugins": {"dsh-ray": {"task_cpus": 0.25}}}))
    tasks = Path(sub) / "tasks.jsonl"
    tasks.write_text("".join(json.dumps({"id": i, "prompt": f"task {i}"}) + "\n"
                             for i in range(n)))
    devnull = open(os.devnull, "w")  # noqa: SIM115 - the summary line
    t0 = time.perf_counter()
    code = run_batch(app, str(tasks), results=Path(sub) / "results.jsonl", workers=workers,
                     agent=None, overrides={"model": model}, limits=None, task_limits=None,
                     retries=0, executor=executor, ordered=False, err=devnull)
    elapsed = time.perf_counter() - t0
    devnull.close()
    lines = (Path(sub) / "results.jsonl").read_text().count("\n")
    assert code == 0 and lines == n, (code, lines)
    return elapsed


def floor(rounds: int = 200) -> tuple[float, float]:
    """Ray's own latency: a trivial task, an actor call (ms, median)."""
    import ray

    @ray.remote(num_cpus=0.25)
    def f(x: int) -> int:
        return x

    @ray.remote(num_cpus=0)
    class A:
        def g(self, x: int) -> int:
            return x

    a = A.remote()  # type: ignore[attr-defined]
    ray.get([f.remote(0) for _ in range(8)])
    ray.get(a.g.remote(0))
    tasks, calls = [], []
    for i in range(rounds):
        t0 = time.perf_counter()
        ray.get(f.remote(i))
        tasks.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        ray.get(a.g.remote(i))
        calls.append(time.perf_counter() - t0)
    ray.kill(a)
    return statistics.median(tasks) * 1e3, statistics.median(calls) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tasks", type=int, default=60)
    parser.add_argument("--workers", default="1,4")
    parser.add_argument("--num-cpus", type=float, default=2)
    args = parser.parse_args()
    import logging

    import ray

    tmp = tmpdir()
    model = setup(tmp)
    t0 = time.perf_counter()
    ray.init(num_cpus=args.num_cpus, include_dashboard=False, logging_level=logging.ERROR,
             log_to_driver=False, runtime_env={"env_vars": {"PYTHONPATH": tmp}})
    print(f"ray.init: {time.perf_counter() - t0:.1f}s (not counted)")
    task_ms, call_ms = floor()
    print(f"floor: a trivial Ray task {task_ms:.2f} ms, an actor call {call_ms:.2f} ms "
          "(median, one at a time)")
    n = args.tasks
    print("| workers | local ms/task | ray ms/task | ray - local |")
    print("|--:|--:|--:|--:|")
    for w in (int(x) for x in args.workers.split(",")):
        once(model, n, w, "local")
        once(model, n, w, "ray")  # warm-up: worker processes start, build their App
        local = once(model, n, w, "local") / n * 1e3
        on_ray = once(model, n, w, "ray") / n * 1e3
        print(f"| {w} | {local:.1f} | {on_ray:.1f} | {on_ray - local:+.1f} |")
    ray.shutdown()


if __name__ == "__main__":
    main()
