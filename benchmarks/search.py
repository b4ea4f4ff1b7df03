"""Searching sessions at scale (issue 37, item 4): ``dsh sessions search MARKER`` against
``dsh sessions list --limit 20`` over 10,000 sessions, paired, in fresh processes.

    python benchmarks/search.py [--sessions 10000] [--rounds 15] [--root DIR]

Makes one real session with ``dsh run -m echo`` and copies its ledger N times under new ids
(as ``benchmarks/sessions.py`` does), one copy with a marker word in its prompt; then warms
the index (the first listing summarises every ledger, the first search reads every ledger
into the full-text index) and times, round after round, the two commands back to back in
alternating order:

* ``search``: ``dsh sessions search MARKER`` (one hit; every ledger ``stat``-ed, the FTS5
  table asked);
* ``list``: ``dsh sessions list --limit 20``;
* ``search - list``: the median of each round's difference (the pair shares the load of its
  moment), and the CPU time (user + system) of each, medians;
* ``search only`` / ``list only``: the same inside a process whose imports are done (the
  index's own cost, without start-up).

Target: ``search`` within 100 ms of ``list``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.sessions import LAST_CPU  # noqa: E402
from benchmarks.sessions import _dsh  # noqa: E402
from benchmarks.sessions import _ids  # noqa: E402

MARKER = "zyxquartzmarker"
PROMPT = b"list the files here, then summarise them"

CHILD = r"""
import sys, time
from itertools import islice
from pathlib import Path
from dsh.ledger.store import JsonlStore
from dsh.ledger.reader import newest_sessions
from dsh.ledger.search import search
t0 = time.perf_counter()
store = JsonlStore(Path(sys.argv[1]))
if sys.argv[2] == "search":
    found = search(store, sys.argv[3], limit=20)
else:
    found = list(islice(newest_sessions(store, on_skip=lambda p, why: None), 20))
print(time.perf_counter() - t0)
"""


def _inside(directory: str, *what: str) -> float:
    out = subprocess.run([sys.executable, "-c", CHILD, directory, *what], check=True,
                         capture_output=True, text=True).stdout
    return float(out)


def make_store(home: str, n: int, template: bytes, old_id: str) -> str:
    directory = os.path.join(home, "sessions")
    os.makedirs(directory, mode=0o700, exist_ok=True)
    needle = old_id.encode()
    ids = _ids(n, time.time() - n / 1000 - 86400)
    marked = ids[n // 3]
    for sid in ids:
        data = template.replace(needle, sid.encode())
        if sid == marked:
            data = data.replace(PROMPT, f"{MARKER} is in this one".encode())
        fd = os.open(os.path.join(directory, sid + ".jsonl"),
                     os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        os.write(fd, data)
        os.close(fd)
    return directory


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sessions", type=int, default=10000)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--root", help="make the session folder here and keep it (reused)")
    args = parser.parse_args()
    root = args.root or tempfile.mkdtemp(prefix="dsh-bench-search-")
    try:
        home = os.path.join(root, f"n{args.sessions}")
        made = rebuild = first = None
        if not os.path.isdir(os.path.join(home, "sessions")):
            seed = os.path.join(root, "seed")
            _dsh(seed, "run", "-m", "echo", PROMPT.decode())
            (path,) = [p for p in os.listdir(os.path.join(seed, "sessions"))
                       if p.endswith(".jsonl")]
            with open(os.path.join(seed, "sessions", path), "rb") as f:
                template = f.read()
            t0 = time.perf_counter()
            make_store(home, args.sessions, template, path[:-len(".jsonl")])
            made = time.perf_counter() - t0
            rebuild = _dsh(home, "sessions", "list", "--limit", "20")
            first = _dsh(home, "sessions", "search", MARKER)
        directory = os.path.join(home, "sessions")
        _dsh(home, "sessions", "search", MARKER)  # warm: the index holds every ledger
        _dsh(home, "sessions", "list", "--limit", "20")
        search, listing, diffs, search_cpu, list_cpu, s_in, l_in = [], [], [], [], [], [], []
        for r in range(args.rounds):
            order = ("search", "list") if r % 2 == 0 else ("list", "search")
            got = {}
            for which in order:
                if which == "search":
                    got[which] = _dsh(home, "sessions", "search", MARKER)
                    search_cpu.append(LAST_CPU[0])
                else:
                    got[which] = _dsh(home, "sessions", "list", "--limit", "20")
                    list_cpu.append(LAST_CPU[0])
            search.append(got["search"])
            listing.append(got["list"])
            diffs.append(got["search"] - got["list"])
            s_in.append(_inside(directory, "search", MARKER))
            l_in.append(_inside(directory, "list"))
        med = statistics.median
        print(f"{args.sessions} sessions, {args.rounds} paired rounds (medians)")
        if made is not None:
            print(f"  made {made:.2f}s; first listing (index built) {rebuild:.2f}s; "
                  f"first search (every ledger read into FTS5) {first:.2f}s")
        print(f"  search {med(search) * 1000:7.1f} ms wall {med(search_cpu) * 1000:7.1f} ms CPU"
              f"   search only {med(s_in) * 1000:6.2f} ms")
        print(f"  list   {med(listing) * 1000:7.1f} ms wall {med(list_cpu) * 1000:7.1f} ms CPU"
              f"   list only   {med(l_in) * 1000:6.2f} ms")
        print(f"  search - list, paired: {med(diffs) * 1000:+.1f} ms wall "
              f"(target: within +100 ms)")
        print(json.dumps({"search": med(search), "list": med(listing), "diff": med(diffs),
                          "search_cpu": med(search_cpu), "list_cpu": med(list_cpu),
                          "search_only": med(s_in), "list_only": med(l_in)}))
    finally:
        if args.root:
            print(f"kept {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
