"""``dsh batch`` (issue 16): throughput against the ideal, overhead per task, peak RSS.

    python benchmarks/batch.py [--workers 1,8,32,128] [--per-worker 6] [--rss 1000,5000]

* **throughput**: tasks of 3 steps, a scripted model waiting 200 ms per request (an I/O-bound
  provider) and a trivial tool, run by the local executor in-process
  (:func:`dsh.batch.runner.run_batch`, results to a file) with ``--workers W``; ``per-worker × W``
  tasks (at least 8), so each row takes about the same wall time. Ideal: ``W / 0.6 s``.
* **overhead**: the same tasks with no delay, ``--workers 1``, against a bare loop of
  ``App.open_session`` + ``Session.send`` (what the executor adds per task: the journal, the
  result line, the budget chain, the progress counters).
* **peak RSS**: ``dsh batch`` in a subprocess over N tasks (no delay, 8 workers), the child's
  ``ru_maxrss`` (os.wait4): it must not grow with N (results are streamed, not held).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks._common import bench_app  # noqa: E402
from benchmarks._common import tmpdir  # noqa: E402


def script(tmp: str, delay: float) -> str:
    call = {"tool_calls": [{"name": "noop", "arguments": {"x": 1}}], "delay": delay}
    responses = [call, call, {"text": "done", "delay": delay}]
    path = Path(tmp) / f"script-{delay}.json"
    path.write_text(json.dumps({"responses": responses}))
    return f"scripted:{path}"


def tasks_file(tmp: str, n: int) -> Path:
    path = Path(tmp) / f"tasks-{n}.jsonl"
    path.write_text("".join(json.dumps({"id": i, "prompt": f"task {i}"}) + "\n"
                            for i in range(n)))
    return path


def run_batch_once(n: int, workers: int, delay: float, fsync: str = "step") -> float:
    """Seconds for ``n`` tasks through the local executor, in this process."""
    from dsh.batch.runner import run_batch

    tmp = tmpdir()
    app = bench_app(tmp, fsync=fsync)
    model = script(tmp, delay)
    tasks = tasks_file(tmp, n)
    devnull = open(os.devnull, "w")  # noqa: SIM115 - the summary line
    t0 = time.perf_counter()
    code = run_batch(app, str(tasks), results=Path(tmp) / "results.jsonl", workers=workers,
                     agent=None, overrides={"model": model}, limits=None, task_limits=None,
                     retries=0, executor="local", ordered=False, err=devnull)
    elapsed = time.perf_counter() - t0
    devnull.close()
    lines = (Path(tmp) / "results.jsonl").read_text().count("\n")
    assert code == 0 and lines == n, (code, lines)
    return elapsed


def bare_loop(n: int, fsync: str = "step") -> float:
    """Seconds for ``n`` tasks as a plain loop of open_session + send."""
    tmp = tmpdir()
    app = bench_app(tmp, fsync=fsync)
    agent = app.agent(model=script(tmp, 0.0))
    t0 = time.perf_counter()
    for i in range(n):
        with app.open_session(agent) as session:
            result = session.send(f"task {i}")
        assert result.outcome == "completed", result.reason
    return time.perf_counter() - t0


RSS_CHILD = r"""
import sys
sys.path.insert(0, sys.argv[1])
from benchmarks._common import bench_app
from dsh.batch.runner import run_batch
from pathlib import Path
app = bench_app(sys.argv[2])
code = run_batch(app, sys.argv[3], results=Path(sys.argv[2]) / "results.jsonl", workers=8,
                 agent=None, overrides={"model": sys.argv[4]}, limits=None, task_limits=None,
                 retries=0, executor="local", ordered=False)
sys.exit(code)
"""


def peak_rss(n: int) -> tuple[float, float]:
    """(MiB, seconds) of a child process running an ``n``-task batch."""
    tmp = tmpdir()
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-c", RSS_CHILD, root, tmp,
                             str(tasks_file(tmp, n)), script(tmp, 0.0)],
                            stderr=subprocess.DEVNULL)
    _, status, usage = os.wait4(proc.pid, 0)
    elapsed = time.perf_counter() - t0
    assert os.waitstatus_to_exitcode(status) == 0
    return usage.ru_maxrss / 1024, elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", default="1,8,32,128")
    parser.add_argument("--per-worker", type=int, default=6)
    parser.add_argument("--overhead-tasks", type=int, default=200)
    parser.add_argument("--rss", default="1000,5000")
    args = parser.parse_args()
    out: dict[str, Any] = {"throughput": [], "rss": []}
    print("throughput: 3 steps per task, 200 ms per request (ideal: workers / 0.6 s)")
    for w in (int(x) for x in args.workers.split(",")):
        n = max(8, args.per_worker * w)
        seconds = run_batch_once(n, w, 0.2)
        rate, ideal = n / seconds, w / 0.6
        print(f"  --workers {w:>3}: {n:>4} tasks in {seconds:6.2f} s = {rate:7.2f} tasks/s "
              f"(ideal {ideal:7.2f}: {100 * rate / ideal:5.1f}%)", flush=True)
        out["throughput"].append({"workers": w, "tasks": n, "seconds": seconds,
                                  "rate": rate, "ideal": ideal})
    n = args.overhead_tasks
    bare_loop(10, "never")
    run_batch_once(10, 1, 0.0, "never")  # warm both paths up (imports, first agent)
    bares, batches = [], []
    for _ in range(5):  # interleaved, fsync off: the CPU dsh batch adds, not the disk's
        bares.append(bare_loop(n, "never") / n)
        batches.append(run_batch_once(n, 1, 0.0, "never") / n)
    bare, batch = statistics.median(bares), statistics.median(batches)
    print(f"overhead: {n} tasks of 3 steps, no delay, fsync off, median of 5 interleaved: "
          f"bare loop {bare * 1e3:.2f} ms/task, dsh batch --workers 1 "
          f"{batch * 1e3:.2f} ms/task ({(batch - bare) * 1e3:+.2f} ms)", flush=True)
    out["overhead"] = {"bare_ms": bare * 1e3, "batch_ms": batch * 1e3}
    for n in (int(x) for x in args.rss.split(",")):
        mib, seconds = peak_rss(n)
        print(f"peak RSS: {n:>6} tasks: {mib:6.1f} MiB ({seconds:.1f} s)", flush=True)
        out["rss"].append({"tasks": n, "mib": mib, "seconds": seconds})
    print(json.dumps(out))


if __name__ == "__main__":
    main()
