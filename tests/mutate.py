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
reason each cannot change behaviour, matched by function and by the line before and after the
change (not by mutant number); an entry that matches no survivor is reported.

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

#: The tests of the ledger's store, scan, writer and blobs modules (one module until issue 21).
_LEDGER_TESTS = (
    "tests/test_ledger.py",
    "tests/test_ledger_pins.py",
    "tests/test_history.py",
    "tests/test_attachments.py",  # the session's blob store (put/get_attachment)
)

#: The tests of dsh/run/compaction/: scripted models, and a llama.cpp-like loopback server.
#: (test_compaction_fit.py's 30-turn sessions are left out: minutes per mutant.)
_COMPACTION_TESTS = (
    "tests/test_compaction.py",
    "tests/test_compaction_pins.py",
)

#: module name -> (source file, test files). Test files that do not exist are left out.
MODULES: dict[str, tuple[str, tuple[str, ...]]] = {
    "ledger": ("dsh/ledger/store.py", _LEDGER_TESTS),
    "ledger-scan": ("dsh/ledger/scan.py", _LEDGER_TESTS),
    "ledger-writer": ("dsh/ledger/writer.py", _LEDGER_TESTS),
    "ledger-blobs": ("dsh/ledger/blobs.py", _LEDGER_TESTS),
    "runcontext": ("dsh/host/runcontext.py", (
        "tests/test_runcontext_pins.py",
        "tests/test_budget_exact.py",
        "tests/test_execution.py",
    )),
    "plugin-events": ("dsh/ledger/plugin_events.py", (
        "tests/test_plugin_events.py",
        "tests/test_plugin_events_pins.py",
        "tests/test_plugin_events_lazy.py",
        "tests/test_state.py",
    )),
    "state": ("dsh/ledger/state.py", (
        "tests/test_state.py",  # test_issue25_api.py runs dsh in subprocesses: not here
        "tests/test_state_pins.py",
        "tests/test_state_replaces.py",
    )),
    "reader": ("dsh/ledger/reader.py", (
        "tests/test_state.py",
    )),
    "history": ("dsh/ledger/history.py", (
        "tests/test_history.py",
        "tests/test_history_pins.py",
        "tests/test_plugin_events_lazy.py",
    )),
    "rescue": ("dsh/llm/rescue.py", (
        "tests/test_rescue.py",
        "tests/test_rescue_pins.py",
    )),
    "transport": ("dsh/llm/transport.py", (
        "tests/test_c3_transport.py",
        "tests/test_c3_bytes.py",
        "tests/test_transport_pins.py",
        "tests/test_openai.py",
        "tests/test_anthropic.py",
    )),
    "record": ("dsh/llm/record.py", (  # split from transport.py (issue 21)
        "tests/test_c3_transport.py",
        "tests/test_c3_bytes.py",
        "tests/test_transport_pins.py",
    )),
    "invariant": ("dsh/llm/invariant.py", (  # split from transport.py (issue 21)
        "tests/test_c3_transport.py",
        "tests/test_transport_pins.py",
    )),
    # dsh/run/compaction/ (issue 26): one entry per module of the package; `compaction`
    # runs them all (GROUPS).
    "compaction-estimate": ("dsh/run/compaction/estimate.py", _COMPACTION_TESTS),
    "compaction-strategies": ("dsh/run/compaction/strategies.py", _COMPACTION_TESTS),
    "compaction-summary": ("dsh/run/compaction/summary.py", _COMPACTION_TESTS),
    "compaction-trigger": ("dsh/run/compaction/trigger.py", _COMPACTION_TESTS),
}

#: Names that stand for several modules.
GROUPS: dict[str, tuple[str, ...]] = {
    "compaction": ("compaction-estimate", "compaction-strategies", "compaction-summary",
                   "compaction-trigger"),
}

#: Equivalent mutants: (function, original fragment, mutated fragment, why it cannot change
#: behaviour). A survivor of ``function`` (mutmut's name up to ``__mutmut_``) whose diff removes
#: a line holding the first fragment and adds one holding the second is counted as equivalent.
#: Matching by content, not by mutant number, keeps an entry right when the numbering shifts.
#: frozen_json's early-return test (dsh/ledger/state.py), for its equivalents below
_FAST = ("t is FrozenDict or t is FrozenList or t is str or t is int or t is bool "
         "or value is None")
_FAST_PARTS = _FAST.split(" or ")

EQUIVALENT: list[tuple[str, str, str, str]] = [
    # dsh/ledger/history.py
    ("dsh.ledger.history.xǁProjectionǁapply_raw", "if type(seq) is not int:",
     "if type(None) is not int:",
     "the type check is a shortcut: checked(seq, int) passes an int anyway"),
    ("dsh.ledger.history.xǁProjectionǁapply_raw", "checked(seq, int)", "checked(None, int)",
     "reached only for a non-int seq, where checking None raises the same InvalidLine"),
    ("dsh.ledger.history.xǁProjectionǁapply_raw", "checked(seq, int)", "checked(seq, None)",
     "no value has type None, so this raises the same InvalidLine"),
    ("dsh.ledger.history.x_render_history", "ensure_ascii=False", "ensure_ascii=None",
     "json.dumps tests ensure_ascii for truth: None behaves as False"),
    ("dsh.ledger.history.xǁ_Unreadǁbuilt", "event = self.event", "event = None",
     "the unlocked read is a shortcut: under the lock the event is read again, and a built "
     "one is returned as it is (only the lock is taken once more)"),
    # dsh/ledger/writer.py, scan.py and store.py (one module until issue 21)
    ("dsh.ledger.writer.x__now", "second != _SECOND[0]", "second != _SECOND[1]",
     "compares the second with the cached string: always unequal, so the stamp is "
     "recomputed each time, with the same result (only the cache is lost)"),
    ("dsh.ledger.scan.x__scan_fast", "search(data, 0, good)", "search(data, 1, good)",
     "a line that parses starts with '{' at byte 0, so no escape can start there"),
    ("dsh.ledger.scan.x__scan_fast", 'data.find(b"\\n", min(', 'data.rfind(b"\\n", min(',
     "only the chunking changes (the rest of the file in one chunk); every line is still "
     "checked the same way"),
    ("dsh.ledger.scan.x_parse_line", "ensure_ascii=False", "ensure_ascii=None",
     "json.dumps tests ensure_ascii for truth: None behaves as False"),
    ("dsh.ledger.scan.x_parse_line", "nested too deeply to read", "LedgerError(None)",
     "the second 'nested too deeply' (from dumps, marked no cover) is unreachable: loads "
     "of the same line fails first"),
    ("dsh.ledger.scan.x__turn_starts", 'rfind(b"\\n", 0, pos)', 'rfind(b"\\n", None, pos)',
     "bytes.rfind takes None as the start of the buffer, as 0"),
    ("dsh.ledger.scan.x_scan", "while pos < size:", "while pos <= size:",
     "at pos == size the search finds no newline and returns (size, 0), as the loop's end "
     "does"),
    *[("dsh.ledger.writer.x_sanitized", '("seq", "ts", "session", "extra")', after,
       "seq is an int and ts is ASCII: cleaning them finds nothing")
      for after in ('"XXseqXX"', '"SEQ"', '"XXtsXX"', '"TS"')],
    *[("dsh.ledger.writer.x_sanitized", '("seq", "ts", "session", "extra")', after,
       "a session id with a surrogate is refused by JsonlStore.path (not printable), so "
       "cleaning it finds nothing in any stored session")
      for after in ('"XXsessionXX"', '"SESSION"')],
    ("dsh.ledger.store.xǁJsonlStoreǁinfo", 'data.split(b"\\n", 64)', 'data.split(b"\\n", )',
     "maxsplit only saves work: the first 64 pieces are the same lines"),
    ("dsh.ledger.store.xǁJsonlStoreǁinfo", 'data.split(b"\\n", 64)', 'data.split(b"\\n", 65)',
     "the first 64 pieces are the same lines either way"),
    ("dsh.ledger.store.xǁJsonlStoreǁinfo", 'not line.strip() or b"\\n" in line',
     'not line.strip() and b"\\n" in line',
     "none of the first 64 pieces holds a newline; a blank line then fails parse_line, "
     "which breaks the same way"),
    ("dsh.ledger.store.xǁJsonlStoreǁinfo", 'or b"\\n" in line', 'b"XX\\nXX" in line',
     "none of the first 64 pieces holds a newline, so the test is false either way"),
    ("dsh.ledger.store.xǁJsonlStoreǁinfo", 'f"{path}:{lineno}"', "parse_line(line, codec, None,",
     "where only names the error, and info() swallows the error"),
    ("dsh.ledger.store.xǁJsonlStoreǁinfo", 'last > 0 and info["turns"] > 1',
     'last > 0 or info["turns"] > 1',
     "with one turn the only turn/start is line 1, whose model the first pass already took"),
    ("dsh.ledger.store.xǁJsonlStoreǁinfo", 'last > 0 and info["turns"] > 1',
     'info["turns"] >= 1',
     "with one turn the only turn/start is line 1, whose model the first pass already took"),
    ("dsh.ledger.store.xǁJsonlStoreǁinfo", 'last > 0 and info["turns"] > 1', "last >= 0 and",
     "a ledger line starts with '{', so the tag is never at byte 0"),
    ("dsh.ledger.store.xǁJsonlStoreǁinfo", 'last > 0 and info["turns"] > 1', "last > 1 and",
     "the tag can start at byte 1 only in line 1, and with two turns the last tag is later"),
    ("dsh.ledger.store.xǁJsonlStoreǁinfo", 'data.rfind(b"\\n", 0, last)',
     'data.rfind(b"\\n", None, last)', "a start of None is 0"),
    ("dsh.ledger.store.xǁJsonlStoreǁinfo", 'data.rfind(b"\\n", 0, last)',
     'data.rfind(b"\\n", 1, last)',
     "differs only for a newline at byte 0, and then the line read has a leading newline, "
     "which JSON ignores"),
    ("dsh.ledger.store.xǁJsonlStoreǁopen", "count = 0", "count = None",
     "fresh() sets count to 0 before the first event is counted"),
    ("dsh.ledger.store.xǁJsonlStoreǁopen", "count = 0", "count = 1",
     "fresh() sets count to 0 before the first event is counted"),
    # dsh/llm/rescue.py
    ("dsh.llm.rescue.x__fenced", "if m else", "if (m) or True else",
     "_FENCE_OPEN matches at every fence (its language part may be empty): m is never None"),
    *[("dsh.llm.rescue.x__fenced", 'if m else ("", pos + len(_FENCE))', after,
       "the branch for m = None is unreachable: _FENCE_OPEN matches at every fence")
      for after in ('("XXXX", pos + len(_FENCE))', '("", pos - len(_FENCE))')],
    ("dsh.llm.rescue.x__fenced", "first = -1", "first = -2",
     "a sentinel only ever tested for being negative"),
    ("dsh.llm.rescue.x__fenced", "value = None", 'value = ""',
     "an empty string is not call-shaped either: the fence is skipped the same way"),
    ("dsh.llm.rescue.x__fenced", "pos = -1 if close < 0", "pos = -2 if close < 0",
     "ends the loop (pos >= 0) the same way"),
    *[("dsh.llm.rescue.x__fenced", "if close < 0 else", after,
       "close is searched from after an opening fence, so it is never 0")
      for after in ("if close <= 0 else", "if close < 1 else")],
    ("dsh.llm.rescue.x__json_sequence", "llama = False", "llama = None",
     "only ever or-ed with booleans and tested for truth"),
    # dsh/ledger/plugin_events.py
    *[("dsh.ledger.plugin_events.xǁEventsViewǁ__eq__", "zip(self, other, strict=True)", after,
       "the lengths are compared first (and short-circuit): zip only ever gets two sequences "
       "of the same length, where strict never matters (a Sequence whose len() disagrees with "
       "its iteration is not one)")
      for after in ("strict=None", "strict=False", "zip(self, other, )")],
    *[("dsh.ledger.plugin_events.x_checked_raw", before, after,
       "the default stands for an absent field, checked for its type only: another value of "
       "the same type is read the same")
      for before, after in (('d.get("seq", 0)', 'd.get("seq", 1)'),
                            ('d.get("ts", "")', 'd.get("ts", "XXXX")'),
                            ('d.get("session", "")', 'd.get("session", "XXXX")'))],
    ("dsh.ledger.plugin_events.x_record_event", 'getattr(ctx, "session", None)',
     'getattr(ctx, "session", )', "the context is always a RunContext, whose attrs field "
     "session always exists (None when made by hand): the default is never used"),
    # dsh/ledger/state.py
    # frozen_json's first lines only return early what its walk returns as it is (a frozen
    # container, str, int, bool, None): a mutant that skips the early return for some of
    # them, or takes it for none, gives the same value by the longer way
    *[("dsh.ledger.state.x_frozen_json", "t = type(value)", after,
       "the early return is a shortcut: the walk returns the same object for these types")
      for after in ("t = None", "t = type(None)")],
    *[("dsh.ledger.state.x_frozen_json", _FAST,  # one "or" of the six turned into "and"
       " or ".join(_FAST_PARTS[:i]) + " and " + " or ".join(_FAST_PARTS[i:]),
       "the early return is a shortcut: the walk returns the same object for these types")
      for i in range(1, len(_FAST_PARTS))],
    ("dsh.ledger.state.xǁStateKeyǁapply", "ensure_ascii=False", "ensure_ascii=None",
     "json.dumps tests ensure_ascii for truth: None behaves as False"),
    ("dsh.ledger.state.xǁStateKeyǁapply", "allow_nan=False)", "allow_nan=None)",
     "json.dumps tests allow_nan for truth: None behaves as False"),
    ("dsh.ledger.state.xǁStateKeyǁupdate", 'getattr(ctx, "session", None)',
     'getattr(ctx, "session", )', "the context is always a RunContext, whose attrs field "
     "session always exists (None when made by hand): the default is never used"),
    # dsh/llm/transport.py
    ("dsh.llm.transport.x_guard", 'getattr(fn, "_dsh_transport", False)',
     'getattr(fn, "_dsh_transport", None)', "only tested for truth: None is false as False is"),
    ("dsh.llm.transport.x__hand_over", 'getattr(complete, "_dsh_transport", False)',
     'getattr(complete, "_dsh_transport", None)',
     "only tested for truth: None is false as False is"),
    ("dsh.llm.transport.x_plugin_of_code", "getattr(pm.hook, name, None)",
     "getattr(pm.hook, name, )",
     "every name dir() lists on the hook relay is one of its attributes: the default is "
     "never used"),
    *[("dsh.llm.transport.x_plugin_of_code", before, after,
       "pluggy registers only routines carrying the hookimpl marker attribute, which a "
       "built-in function cannot carry: every implementation has a __code__, so fcode is "
       "never None")
      for before, after in (('getattr(impl.function, "__code__", None)',
                             'getattr(impl.function, "__code__", )'),
                            ("continue", "break"))],
    # dsh/run/compaction/estimate.py
    ("dsh.run.compaction.estimate.x_message_tokens", "ensure_ascii=False", "ensure_ascii=None",
     "json.dumps tests ensure_ascii for truth: None behaves as False"),
    ("dsh.run.compaction.estimate.xǁContextMeterǁfixed", "ensure_ascii=False, default=str",
     "ensure_ascii=None", "json.dumps tests ensure_ascii for truth: None behaves as False"),
    *[("dsh.run.compaction.estimate.xǁContextMeterǁfixed", "ensure_ascii=False, default=str",
       after, "a tool's parameters are frozen JSON values (FrozenDict is a dict, tuples dump "
       "as lists): json.dumps never calls default")
      for after in ("default=None)", "ensure_ascii=False, )")],
    ("dsh.run.compaction.estimate.xǁContextMeterǁfixed", "self._fixed_key = key",
     "self._fixed_key = None", "the cache key only: the same value is recomputed each time"),
    *[("dsh.run.compaction.estimate.xǁContextMeterǁ__init__", before, after,
       "never read before it is set: the first _extend finds the projection's list is not "
       "_list (None) and starts the sums at [0]; id() is never 0 or 1, so the first fixed() "
       "recomputes the key and the value")
      for before, after in (("self._list: list[Message] | None = None", '= ""'),
                            ("self._prefix: list[int] = [0]", "= None"),
                            ("self._prefix: list[int] = [0]", "= [1]"),
                            ("self._fixed_key: tuple[int, int] = (0, 0)", "= None"),
                            ("self._fixed_key: tuple[int, int] = (0, 0)", "= (1, 0)"),
                            ("self._fixed_key: tuple[int, int] = (0, 0)", "= (0, 1)"),
                            ("self._fixed = 0", "self._fixed = None"),
                            ("self._fixed = 0", "self._fixed = 1"))],
    # dsh/run/compaction/strategies.py
    ("dsh.run.compaction.strategies.x_split_point", "budget = max(0, request.target // 2)",
     "budget = max(1,", "the kept part always holds two messages or more (the latest start "
     "is not compared), at least 8 raw tokens, so it is never under a budget of 1 either"),
    ("dsh.run.compaction.strategies.x_split_point", "budget = max(0, request.target // 2)",
     "request.target / 2)", "compared with integer token counts: x > n // 2 exactly when "
     "x > n / 2"),
    *[("dsh.run.compaction.strategies.x_truncate", "strict=False", after,
       "bounds[1:] is one shorter than bounds by construction: strict=False is zip's default")
      for after in ("strict=None", "bounds[1:], )")],
    *[("dsh.run.compaction.strategies.x_truncate", 'role == "user"), default=-1)', after,
       "newest is only compared with unit starts (indices from 0): -2 and None match none "
       "of them, as -1 does")
      for after in ("default=None)", "default=-2)")],
    ("dsh.run.compaction.strategies.x_truncate", "best: Compaction | None = None",
     'best: Compaction | None = ""', "droppable is not empty here, so the loop sets best "
     "before it is read"),
    # dsh/run/compaction/trigger.py
    ("dsh.run.compaction.trigger.x_is_context_error", 'getattr(exc, "context_overflow", False)',
     'getattr(exc, "context_overflow", None)', "only tested for truth: None is false as False "
     "is"),
    # dsh/host/runcontext.py
    ("dsh.host.runcontext.xǁBudgetǁ_refusal", "counts.get(key, 0)", "counts.get(key, 1)",
     "counted units and their limits are integers: used < limit already means "
     "used + 1 <= limit, so the extra unit never changes the answer"),
    *[(f"dsh.host.runcontext.xǁBudgetǁ{fn}", "depth += 1", after,
       "depth is only tested for being non-zero (a parent run), which it is either way")
      for fn, after in (("exceeded", "depth = 1"), ("exceeded", "depth -= 1"),
                        ("exceeded", "depth += 2"), ("reserve", "depth -= 1"),
                        ("reserve", "depth += 2"))],
]

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
    # docs/ too: tests read docs/plugins.md and docs/examples/ next to their own file, which
    # mutmut runs from its copy (mutants/), so docs/ is copied there as well (also_copy)
    for link in ("dsh", "tests", "docs"):
        target = work / link
        if not target.is_symlink():
            target.symlink_to(ROOT / link)
    config = (
        "[tool.mutmut]\n"
        'source_paths = ["dsh"]\n'
        f"only_mutate = {json.dumps([source])}\n"
        f"pytest_add_cli_args_test_selection = {json.dumps(selected)}\n"
        'also_copy = ["docs"]\n'
        'pytest_add_cli_args = ["-p", "no:cacheprovider"]\n'
        "use_git_change_detection = false\n"
        # a mutant that loops forever is stopped after 3x its tests' clean time (+2 s)
        "timeout_multiplier = 3.0\n"
        "timeout_constant = 2.0\n"
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


_DIFFS = """
import json, sys
from pathlib import Path
from mutmut.mutation.diff_apply import get_diff_for_mutant
source, names = sys.argv[1], sys.argv[2:]
print(json.dumps({n: get_diff_for_mutant(n, path=Path(source)) for n in names}))
"""


def _diffs(work: Path, source: str, mutants: list[str]) -> dict[str, str]:
    if not mutants:
        return {}
    out = subprocess.run([sys.executable, "-c", _DIFFS, source, *mutants], cwd=work,
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout)  # type: ignore[no-any-return]


def _function(mutant: str) -> str:
    return mutant.rsplit("__mutmut_", 1)[0]


def _changed(diff: str) -> tuple[list[str], list[str]]:
    lines = diff.splitlines()
    removed = [ln[1:] for ln in lines if ln.startswith("-") and not ln.startswith("---")]
    added = [ln[1:] for ln in lines if ln.startswith("+") and not ln.startswith("+++")]
    return removed, added


def _equivalent(diffs: dict[str, str], module: str) -> tuple[dict[str, str], list[str]]:
    """The survivors matching an EQUIVALENT entry, with its reason; and the unused entries."""
    equivalent: dict[str, str] = {}
    used: set[int] = set()
    for mutant, diff in diffs.items():
        removed, added = _changed(diff)
        for i, (function, before, after, reason) in enumerate(EQUIVALENT):
            if (_function(mutant) == function and any(before in ln for ln in removed)
                    and any(after in ln and before not in ln for ln in added)):
                equivalent[mutant] = reason
                used.add(i)
                break
    unused = [f"{e[0]}: {e[2]!r}" for i, e in enumerate(EQUIVALENT)
              if i not in used and e[0].startswith(module + ".x")]
    return equivalent, unused


def run_module(name: str, *, fresh: bool, max_children: int, show: bool) -> dict[str, object]:
    work, source, selected = _prepare(name, fresh)
    print(f"== {name}: {source} against {' '.join(selected)}", flush=True)
    # Child processes (CLI tests) import the same mutated tree as the tests themselves. The
    # folder must exist before mutmut starts, or Python caches it as missing and the tests'
    # own `import tests...` fails on a first run.
    (work / "mutants").mkdir(exist_ok=True)
    mutants = str(work / "mutants")
    path = os.environ.get("PYTHONPATH")
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1",
               PYTHONPATH=mutants + (os.pathsep + path if path else ""))
    env.pop("MUTANT_UNDER_TEST", None)
    meta = work / "mutants" / (source + ".meta")
    # mutmut keeps a cached verdict until the function changes; tests added since must get
    # their chance at the survivors too, so those are named and re-run after the normal run.
    before = _results(work, source) if meta.exists() else {}

    def mutmut_run(*names: str) -> dict[str, str]:
        proc = subprocess.run([*_mutmut(), "run", "--max-children", str(max_children), *names],
                              cwd=work, env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True)
        if proc.returncode != 0:
            print(proc.stdout[-4000:])
            raise RuntimeError(f"mutmut run failed for {name} (exit {proc.returncode})")
        return _results(work, source)

    statuses = mutmut_run()
    retry = sorted(m for m, st in statuses.items()
                   if st not in KILLED and before.get(m, "not checked") not in (KILLED | {
                       "not checked"}))
    if retry:
        statuses = mutmut_run(*retry)
    survivors = sorted(m for m, st in statuses.items() if st not in KILLED)
    diffs = _diffs(work, source, survivors)
    equivalent, unused = _equivalent(diffs, source.removesuffix(".py").replace("/", "."))
    counts: dict[str, int] = {}
    for mutant, status in statuses.items():
        key = "equivalent" if mutant in equivalent else status
        counts[key] = counts.get(key, 0) + 1
    total = len(statuses)
    scored = total - counts.get("equivalent", 0)
    killed = counts.get("killed", 0) + counts.get("timeout", 0)
    score = 100.0 * killed / scored if scored else 100.0
    for mutant in survivors:
        if mutant in equivalent:
            continue
        print(f"   {statuses[mutant]:>10}  {mutant}")
        if show:
            removed, added = _changed(diffs[mutant])
            print("\n".join([f"      - {ln.strip()}" for ln in removed]
                            + [f"      + {ln.strip()}" for ln in added]))
    if show:
        for mutant, reason in sorted(equivalent.items()):
            print(f"   equivalent  {mutant}: {reason}")
    for entry in unused:
        print(f"   EQUIVALENT entry matched no survivor (killed now, or the code moved): {entry}")
    return {"module": name, "source": source, "total": total, "score": score, **counts}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("modules", nargs="*",
                        help=f"any of: {', '.join([*MODULES, *GROUPS])}")
    parser.add_argument("--list", action="store_true", help="print the modules and their tests")
    parser.add_argument("--fresh", action="store_true", help="forget cached results")
    parser.add_argument("--show", action="store_true", help="print surviving mutants' diffs")
    parser.add_argument("--max-children", type=int, default=2)
    parser.add_argument("--fail-under", type=float, default=0.0, metavar="PERCENT")
    args = parser.parse_args(argv)
    args.modules = [m for name in args.modules for m in GROUPS.get(name, (name,))]
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
    for group, members in GROUPS.items():  # a group's row: its modules' mutants together
        part = [r for r in rows if r["module"] in members]
        if len(part) > 1:
            sums = {c: sum(int(str(r.get(c, 0))) for r in part) for c in (*cols, "total")}
            scored = sums["total"] - sums["equivalent"]
            got = sums["killed"] + sums["timeout"]
            cells = " ".join(f"{sums[c]:>10}" for c in cols)
            print(f"{group:<11} {sums['total']:>5} {cells}   "
                  f"{100.0 * got / scored if scored else 100.0:.1f}%")
    if failed:
        print(f"a module scored below {args.fail_under:g}%", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
