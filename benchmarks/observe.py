"""What observation costs (MISSION D7): CPU of an observed vs an unobserved 200-step run.

    python benchmarks/observe.py [--steps 200] [--pairs 15]

Both runs are the same scripted 200-step tool loop (ledger in memory, so the kernel's fsync
price does not blur the comparison). The observed run has an observer that, like
`dsh run --events`, turns every event into a JSON line (written to /dev/null), and its
provider streams. Runs are paired (observed, unobserved, alternately) and the median of the
per-pair ratios is printed. The last line reads ``observed/unobserved CPU ratio: R x``.

Target: ≥ 1.6x — a floor on what *not* observing saves (observation is conditional: an
unobserved run builds no live event and does not stream; the design says about 2x). It is
met by keeping the unobserved step cheap, never by making the observed one dearer: the
observer here is fixed (one ``event_to_dict`` and ``json.dumps`` per event).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks._common import bench_app  # noqa: E402
from benchmarks._common import tmpdir  # noqa: E402
from benchmarks._common import tool_loop_script  # noqa: E402
from dsh.ledger.serialize import event_to_dict  # noqa: E402
from dsh.llm.builtin import ScriptedModel  # noqa: E402


def one_run(steps: int, observed: bool, sink: object) -> float:
    app = bench_app(tmpdir())
    agent = app.agent(model="echo")
    agent._model = ScriptedModel("", {"responses": tool_loop_script(steps)})

    def on_event(event: object) -> None:
        d = event_to_dict(event) if hasattr(event, "seq") else {  # type: ignore[arg-type]
            "type": event.type, **event.data}  # type: ignore[attr-defined]
        sink.write(json.dumps(d) + "\n")  # type: ignore[attr-defined]

    gc.collect()
    with app.open_session(agent, save=False) as s:
        t0 = time.process_time()
        result = s.send("go", on_event=on_event if observed else None)
        cpu = time.process_time() - t0
    assert result.outcome == "completed" and result.steps == steps, result.reason
    return cpu


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--pairs", type=int, default=15)
    args = ap.parse_args()
    ratios, obs, unobs = [], [], []
    with open(os.devnull, "w") as sink:
        one_run(args.steps, True, sink)  # warm-up: imports, caches
        for _ in range(args.pairs):
            o = one_run(args.steps, True, sink)
            u = one_run(args.steps, False, sink)
            obs.append(o)
            unobs.append(u)
            ratios.append(o / u)
    per = 1e6 / args.steps
    n = args.pairs
    print(f"unobserved: {statistics.median(unobs) * per:.1f} us CPU per step (median of {n})")
    print(f"observed:   {statistics.median(obs) * per:.1f} us CPU per step (median of {n})")
    print(f"observed/unobserved CPU ratio: {statistics.median(ratios):.2f}x  (target >= 1.6x)")


if __name__ == "__main__":
    main()
