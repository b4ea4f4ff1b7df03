"""Listing sessions at scale: ``dsh sessions list --limit 20`` at 10, 10k and
100k sessions, side by side, and the session index's full rebuild.

    python benchmarks/sessions.py [--sizes 10,10000,100000] [--rounds 7]

Makes one real session with ``dsh run -m echo`` and copies its ledger N times under new ids
(the store's own format, byte for byte: only the id differs), so 100k sessions take seconds to
make. For each size it times, in fresh processes:

* ``rebuild``: the first listing with no index (every ledger summarised once, index written);
* ``list``: ``dsh sessions list --limit 20`` with the index in place (median of the rounds,
  sizes interleaved so that load drifts alike), and its difference from the smallest size;
* ``list CPU``: the CPU time (user + system) of those processes, median: what a loaded
  machine's wall time hides;
* ``listing only``: the same listing timed inside a process whose imports are done (the
  index's own cost, without the start-up noise of a loaded machine);
* ``after new``: the same right after one more ledger appeared in the folder (its names are
  listed again, only the new ledger is read);
* ``no index`` (not with ``--root``): with the index folder made unusable (a file where its
  folder would be, so the ledgers are all read, as before the index) — only up to
  ``--scan-max`` sessions.

* ``- start``: the median over the rounds of ``list`` less a plain start timed beside it in
  the same round (``dsh run -m echo hi`` in a home of its own, so the listed folders do not
  change): what listing costs beyond starting dsh at all.

Targets: ``list`` at 100k within 50 ms of ``list`` at 10; within 30 ms of a plain
start, paired (the figure as a ratio to a floor measured in the same run).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _env(home: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update(DSH_HOME=home, XDG_CONFIG_HOME=os.path.join(home, "config"),
               XDG_DATA_HOME=os.path.join(home, "data"), NO_COLOR="1")
    return env


#: CPU seconds (user + system) of the last `_dsh` child: on a loaded machine the wall time
#: is mostly waiting for a CPU, the CPU time much less so.
LAST_CPU = [0.0]


def _dsh(home: str, *args: str) -> float:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "dsh", *args], env=_env(home),
                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    elapsed = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    LAST_CPU[0] = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    if proc.returncode != 0:
        raise SystemExit(f"dsh {' '.join(args)} failed: {proc.stderr.decode()}")
    return elapsed


CHILD = r"""
import sys, time
from itertools import islice
from pathlib import Path
from dsh.ledger.store import JsonlStore
from dsh.ledger.reader import newest_sessions
import dsh.ledger.index  # imported before the clock starts, as the command's imports are
t0 = time.perf_counter()
store = JsonlStore(Path(sys.argv[1]))
found = list(islice(newest_sessions(store, on_skip=lambda p, why: None), 20))
print(time.perf_counter() - t0)
"""


def _inside(directory: str) -> float:
    """The listing alone, in a fresh process whose imports are done: no start-up noise."""
    out = subprocess.run([sys.executable, "-c", CHILD, directory], check=True,
                         capture_output=True, text=True).stdout
    return float(out)


def _ids(n: int, start: float) -> list[str]:
    out = []
    for i in range(n):
        t = start + i / 1000
        stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime(t))
        out.append(f"{stamp}.{int(t * 1000) % 1000:03d}-{i:06x}")
    return out


def make_store(home: str, n: int, template: bytes, old_id: str) -> str:
    directory = os.path.join(home, "sessions")
    os.makedirs(directory, mode=0o700, exist_ok=True)
    needle = old_id.encode()
    for sid in _ids(n, time.time() - n / 1000 - 86400):
        fd = os.open(os.path.join(directory, sid + ".jsonl"),
                     os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        os.write(fd, template.replace(needle, sid.encode()))
        os.close(fd)
    return directory


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="10,10000,100000")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--scan-max", type=int, default=10000,
                        help="measure the no-index listing up to this many sessions")
    parser.add_argument("--keep", action="store_true", help="keep the session folders")
    parser.add_argument("--root", help="make the session folders here and keep them; a "
                        "size already made there is reused (no rebuild is timed for it)")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    root = args.root or tempfile.mkdtemp(prefix="dsh-bench-sessions-")
    args.keep = args.keep or bool(args.root)
    try:
        seed = os.path.join(root, "seed")
        if not os.path.isdir(os.path.join(seed, "sessions")):
            _dsh(seed, "run", "-m", "echo", "list the files here, then summarise them")
        (path,) = [p for p in os.listdir(os.path.join(seed, "sessions")) if p.endswith(".jsonl")]
        old_id = path[:-len(".jsonl")]
        with open(os.path.join(seed, "sessions", path), "rb") as seed_file:
            template = seed_file.read()
        homes = {}
        figures: dict[int, dict[str, float]] = {}
        for n in sizes:
            home = homes[n] = os.path.join(root, f"n{n}")
            if os.path.isdir(os.path.join(home, "sessions")):
                figures[n] = {}
                continue
            t0 = time.perf_counter()
            make_store(home, n, template, old_id)
            made = time.perf_counter() - t0
            rebuild = _dsh(home, "sessions", "list", "--limit", "20")
            figures[n] = {"made": made, "rebuild": rebuild}
        lists: dict[int, list[float]] = {n: [] for n in sizes}
        cpu: dict[int, list[float]] = {n: [] for n in sizes}
        inside: dict[int, list[float]] = {n: [] for n in sizes}
        over_start: dict[int, list[float]] = {n: [] for n in sizes}
        plain = os.path.join(root, "plain-start")  # its own home: the listed folders stay
        _dsh(plain, "run", "-m", "echo", "hi")  # warm
        for _ in range(args.rounds):
            start = _dsh(plain, "run", "-m", "echo", "hi")
            for n in sizes:
                lists[n].append(_dsh(homes[n], "sessions", "list", "--limit", "20"))
                cpu[n].append(LAST_CPU[0])
                over_start[n].append(lists[n][-1] - start)
                inside[n].append(_inside(os.path.join(homes[n], "sessions")))
        for n in sizes:
            figures[n]["- start"] = statistics.median(over_start[n])
            figures[n]["list"] = statistics.median(lists[n])
            figures[n]["list cpu"] = statistics.median(cpu[n])
            figures[n]["listing only"] = statistics.median(inside[n])
            directory = os.path.join(homes[n], "sessions")
            extra = _ids(1, time.time())[0]
            shutil.copyfile(os.path.join(seed, "sessions", path),
                            os.path.join(directory, extra + ".jsonl"))
            figures[n]["after new"] = _dsh(homes[n], "sessions", "list", "--limit", "20")
            if n <= args.scan_max and not args.root:
                index = os.path.join(directory, ".index")
                shutil.rmtree(index)
                with open(index, "w"):
                    pass  # a file where the index folder would be: the ledgers are read
                figures[n]["no index"] = statistics.median(
                    _dsh(homes[n], "sessions", "list", "--limit", "20") for _ in range(3))
                os.unlink(index)
        base = figures[sizes[0]]["list"]
        print(f"{'sessions':>9} {'made':>8} {'rebuild':>9} {'list':>8} "
              f"{'- list@' + str(sizes[0]):>12} {'- start':>9}"
              f" {'list CPU':>9} {'listing only':>13} {'after new':>10} {'no index':>9}")
        for n in sizes:
            f = figures[n]
            head = f"{f['made']:>7.2f}s {f['rebuild']:>8.3f}s" if "made" in f else f"{'reused':>18}"
            print(f"{n:>9} {head} {f['list'] * 1000:>6.1f}ms "
                  f"{(f['list'] - base) * 1000:>+10.1f}ms {f['- start'] * 1000:>+7.1f}ms "
                  f"{f['list cpu'] * 1000:>7.1f}ms "
                  f"{f['listing only'] * 1000:>11.2f}ms "
                  f"{f['after new'] * 1000:>8.1f}ms "
                  + (f"{f['no index'] * 1000:>7.1f}ms" if "no index" in f else f"{'-':>9}"))
        print(json.dumps({str(n): {k: round(v, 4) for k, v in f.items()}
                          for n, f in figures.items()}))
    finally:
        if args.keep:
            print(f"kept {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
