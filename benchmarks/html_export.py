"""Export a synthetic 100,000-event session as HTML with the real ``dsh`` (docs/performance.md).

    python benchmarks/html_export.py [--events 100000] [--open]

Writes the session under a temporary folder, runs ``dsh sessions export --html`` and
``--format jsonl`` (the read path alone, for scale) in subprocesses, and prints the CPU and
wall time of each and the page's size; ``--open`` also loads the page in headless Chromium.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks._common import tmpdir  # noqa: E402
from dsh.core.messages import ToolCall  # noqa: E402
from dsh.core.messages import Usage  # noqa: E402
from dsh.ledger import events as ev  # noqa: E402
from dsh.ledger.serialize import dump_event  # noqa: E402

SID = "20260101-000000.000-big"


def write_session(folder: Path, n: int) -> Path:
    items: list[ev.Event] = [ev.TurnStarted(turn=1, agent="a", model="m"),
                             ev.UserMessage(text="go")]
    step = 0
    while len(items) < n - 6:
        call = ToolCall(id=f"c{step}", name="read", arguments={"n": step})
        items += [ev.StepStarted(turn=1, step=step),
                  ev.AssistantMessage(text=f"thinking about step {step}", tool_calls=(call,),
                                      usage=Usage(input_tokens=1000 + step, output_tokens=20)),
                  ev.ToolCalled(call_id=call.id, name="read", arguments={"n": step}),
                  ev.ToolReturned(call_id=call.id, name="read", output=f"chunk {step}: "
                                  + "the quick brown fox jumps over the lazy dog. " * 7),
                  ev.StepEnded(turn=1, step=step)]
        step += 1
    items.append(ev.TurnEnded(turn=1, outcome="completed"))
    sessions = folder / "sessions"
    sessions.mkdir(parents=True, exist_ok=True)
    with open(sessions / f"{SID}.jsonl", "w") as f:
        for i, e in enumerate(items):
            fields = {a.name: getattr(e, a.name) for a in e.__attrs_attrs__
                      if a.init}
            fields.update(seq=i, session=SID, ts="2026-01-01T00:00:00Z")
            f.write(dump_event(type(e)(**fields)) + "\n")
    (folder / "dsh.toml").write_text(f'autoload = false\nsessions_dir = "{sessions}"\n')
    print(f"{len(items)} events, ledger {(sessions / f'{SID}.jsonl').stat().st_size} bytes")
    return folder / "dsh.toml"


def timed(args: list[str]) -> tuple[float, float]:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    subprocess.run(args, check=True, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return after.ru_utime - before.ru_utime, wall


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--events", type=int, default=100_000)
    ap.add_argument("--open", action="store_true", help="load the page in headless Chromium")
    a = ap.parse_args()
    folder = Path(tmpdir())
    config = write_session(folder, a.events)
    dsh = [sys.executable, "-m", "dsh", "--config", str(config), "sessions", "export"]
    page = folder / "big.html"
    cpu, wall = timed([*dsh, "--html", SID, "--output", str(page)])
    print(f"html:  {cpu:.2f} s CPU, {wall:.2f} s wall, page {page.stat().st_size} bytes")
    cpu, wall = timed([*dsh, "--format", "jsonl", SID, "--output", str(folder / "x.jsonl")])
    print(f"jsonl: {cpu:.2f} s CPU, {wall:.2f} s wall")
    browser = shutil.which("chromium")
    if a.open and browser:
        cpu, wall = timed([browser, "--headless", "--no-sandbox", "--disable-gpu",
                           f"--user-data-dir={folder / 'chromium'}", "--dump-dom",
                           page.as_uri()])
        print(f"chromium --dump-dom: {cpu:.2f} s CPU, {wall:.2f} s wall")


if __name__ == "__main__":
    main()
