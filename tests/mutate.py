"""Mutation testing, one module at a time against the tests that exercise it (docs/testing.md).

    python tests/mutate.py                 # every module in MODULES
    python tests/mutate.py ledger rescue   # some of them
    python tests/mutate.py --list          # the modules and their tests
    python tests/mutate.py ledger --show   # also print the diff of every surviving mutant
    tox -e mutate -- ledger                # the same, in a fresh environment

Each module gets a scratch directory ``.mutate/<name>/`` (git-ignored) holding links to
``dsh/`` and ``tests/`` and a ``pyproject.toml`` that scopes mutmut 3 to that one source file
and those test files; mutmut copies the tree into ``.mutate/<name>/mutants/`` and runs, for
each mutant, only the selected tests that call the mutated function. Results are cached per
function there, so a rerun after a change re-tests only what changed (``--fresh`` starts over).

A mutant whose tests run past mutmut's time limit (``timeout_multiplier`` times the clean
run, checked on wall-clock and CPU time) is killed by signal and counted as ``timeout``: an
infinite loop is a detected mutant. Equivalent mutants are listed in ``EQUIVALENT`` with the
reason each cannot change behaviour, and with a fragment of the mutated line so that an entry
that no longer matches (the code moved) is reported as stale instead of silently counted.

The score is ``(killed + timeout) / (total - equivalent)``; ``no tests`` counts as not
killed. ``--fail-under N`` exits 1 when a module scores below N percent.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WORK = ROOT / ".mutate"

#: module name -> (source file, test files). Test files that do not exist are left out.
MODULES: dict[str, tuple[str, tuple[str, ...]]] = {
    "ledger": ("dsh/ledger.py", (
        "tests/test_ledger.py",
        "tests/test_ledger_pins.py",
        "tests/test_history.py",
    )),
    "runcontext": ("dsh/runcontext.py", (
        "tests/test_runcontext_pins.py",
        "tests/test_budget_exact.py",
        "tests/test_execution.py",
    )),
    "history": ("dsh/history.py", (
        "tests/test_history.py",
        "tests/test_history_pins.py",
    )),
    "rescue": ("dsh/llm/rescue.py", (
        "tests/test_rescue.py",
        "tests/test_rescue_pins.py",
    )),
    "transport": ("dsh/llm/transport.py", (
        "tests/test_c3_transport.py",
        "tests/test_openai.py",
        "tests/test_anthropic.py",
    )),
}

#: mutant name -> (a fragment of its mutated line, why it cannot change behaviour).
EQUIVALENT: dict[str, tuple[str, str]] = {}

#: pytest settings inside the scratch tree (mirrors tox.ini's [pytest]).
PYTEST_INI = """
[tool.pytest.ini_options]
addopts = "-p no:cacheprovider"
filterwarnings = ["error"]
"""

KILLED = {"killed", "timeout"}


def _mutmut() -> list[str]:
    exe = Path(sys.executable).with_name("mutmut")
    if not exe.exists():
        sys.exit("mutmut is not installed in this environment: pip install 'mutmut>=3.8,<4' "
                 "(or run `tox -e mutate`)")
    return [str(exe)]


def _prepare(name: str, fresh: bool) -> tuple[Path, str, list[str]]:
    source, tests = MODULES[name]
    if not (ROOT / source).exists():
        raise FileNotFoundError(source)
    selected = [t for t in tests if (ROOT / t).exists()]
    work = WORK / name
    if fresh and work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True, exist_ok=True)
    for link in ("dsh", "tests"):
        target = work / link
        if not target.is_symlink():
            target.symlink_to(ROOT / link)
    config = (
        "[tool.mutmut]\n"
        'source_paths = ["dsh"]\n'
        f"only_mutate = {json.dumps([source])}\n"
        f"pytest_add_cli_args_test_selection = {json.dumps(selected)}\n"
        'pytest_add_cli_args = ["-p", "no:cacheprovider"]\n'
        "use_git_change_detection = false\n"
        'on_dependency_change = "rerun"\n'
        + PYTEST_INI
    )
    pyproject = work / "pyproject.toml"
    if not pyproject.exists() or pyproject.read_text() != config:
        pyproject.write_text(config)
    return work, source, selected


def _results(work: Path, source: str) -> dict[str, str]:
    from mutmut.stats import status_by_exit_code

    meta = json.loads((work / "mutants" / (source + ".meta")).read_text())
    return {key: status_by_exit_code[code] for key, code in meta["exit_code_by_key"].items()}


def _diff(work: Path, mutant: str) -> str:
    out = subprocess.run([*_mutmut(), "show", mutant], cwd=work, capture_output=True, text=True)
    return out.stdout


def _equivalent(work: Path, statuses: dict[str, str]) -> tuple[dict[str, str], list[str]]:
    """The survivors listed in EQUIVALENT whose diff still matches; and the stale entries."""
    equivalent: dict[str, str] = {}
    stale: list[str] = []
    for mutant, (fragment, reason) in EQUIVALENT.items():
        if mutant not in statuses:
            continue
        if statuses[mutant] in KILLED:
            continue  # a test kills it now: not equivalent after all
        added = [ln for ln in _diff(work, mutant).splitlines() if ln.startswith("+ ")]
        if any(fragment in ln for ln in added):
            equivalent[mutant] = reason
        else:
            stale.append(mutant)
    return equivalent, stale


def run_module(name: str, *, fresh: bool, max_children: int, show: bool) -> dict[str, object]:
    work, source, selected = _prepare(name, fresh)
    print(f"== {name}: {source} against {' '.join(selected)}", flush=True)
    # Child processes (CLI tests) import the same mutated tree as the tests themselves.
    mutants = str(work / "mutants")
    path = os.environ.get("PYTHONPATH")
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1",
               PYTHONPATH=mutants + (os.pathsep + path if path else ""))
    env.pop("MUTANT_UNDER_TEST", None)
    proc = subprocess.run([*_mutmut(), "run", "--max-children", str(max_children)],
                          cwd=work, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True)
    if proc.returncode != 0:
        print(proc.stdout[-4000:])
        raise RuntimeError(f"mutmut run failed for {name} (exit {proc.returncode})")
    statuses = _results(work, source)
    equivalent, stale = _equivalent(work, statuses)
    counts: dict[str, int] = {}
    for mutant, status in statuses.items():
        key = "equivalent" if mutant in equivalent else status
        counts[key] = counts.get(key, 0) + 1
    total = len(statuses)
    scored = total - counts.get("equivalent", 0)
    killed = counts.get("killed", 0) + counts.get("timeout", 0)
    score = 100.0 * killed / scored if scored else 100.0
    survivors = sorted(m for m, s in statuses.items() if s not in KILLED and m not in equivalent)
    for mutant in survivors:
        print(f"   {statuses[mutant]:>10}  {mutant}")
        if show:
            print(_diff(work, mutant))
    for mutant in stale:
        print(f"   stale EQUIVALENT entry (its diff changed): {mutant}")
    return {"module": name, "source": source, "total": total, "score": score, **counts}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("modules", nargs="*", help=f"any of: {', '.join(MODULES)}")
    parser.add_argument("--list", action="store_true", help="print the modules and their tests")
    parser.add_argument("--fresh", action="store_true", help="forget cached results")
    parser.add_argument("--show", action="store_true", help="print surviving mutants' diffs")
    parser.add_argument("--max-children", type=int, default=2)
    parser.add_argument("--fail-under", type=float, default=0.0, metavar="PERCENT")
    args = parser.parse_args(argv)
    unknown = [m for m in args.modules if m not in MODULES]
    if unknown:
        parser.error(f"unknown module(s) {', '.join(unknown)}; choose from {', '.join(MODULES)}")
    if args.list:
        for name, (source, tests) in MODULES.items():
            print(f"{name:<11} {source:<22} {' '.join(tests)}")
        return 0
    rows = []
    for name in args.modules or list(MODULES):
        if not (ROOT / MODULES[name][0]).exists():
            print(f"== {name}: {MODULES[name][0]} does not exist, skipped")
            continue
        rows.append(run_module(name, fresh=args.fresh, max_children=args.max_children,
                               show=args.show))
    cols = ("killed", "timeout", "survived", "no tests", "equivalent")
    print()
    print(f"{'module':<11} {'total':>5} " + " ".join(f"{c:>10}" for c in cols) + "   score")
    failed = False
    for r in rows:
        cells = " ".join(f"{r.get(c, 0):>10}" for c in cols)
        other = {k: v for k, v in r.items()
                 if k not in (*cols, "module", "source", "total", "score")}
        extra = f"   ({other})" if other else ""
        print(f"{r['module']:<11} {r['total']:>5} {cells}   {r['score']:.1f}%{extra}")
        failed = failed or float(r["score"]) < args.fail_under  # type: ignore[arg-type]
    if failed:
        print(f"a module scored below {args.fail_under:g}%", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
