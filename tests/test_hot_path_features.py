"""Features a run does not use cost it nothing: deterministic guards, never timings.

Permission modes and grants (``dsh.tools.approval``, ``dsh.tools.grants``), trust digests of
project files (``dsh.config.trust``), the session index and its full-text search
(``dsh.ledger.index``, ``dsh.ledger.search``, ``sqlite3``) and dsh-shell's workbench tools
(each tool's module: ``dsh_shell.edit``, ``grep``, ``patch``…) are each imported where they
are used. Here, each in a fresh process and from an empty folder (no project file to trust):

* none of their modules is imported by ``dsh run -m echo hi`` (dsh-shell loaded),
  ``dsh --help`` or ``dsh --version``;
* a plain tool step with dsh-shell's workbench registered (its twelve tools in every request,
  none called) imports no module, builds no attrs class and makes the same system calls on
  the ledger as a step without it (``tests/test_hot_path.py``'s pin): counted over a 20-step
  and a 10-step turn after a warm-up turn, so per-turn costs cancel.

A failure names the feature and what it gained: keep it off the path (import it inside the
function that uses it), or say here why an unused feature must cost every run.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("dsh_shell")

from tests.test_hot_path import PROBE  # noqa: E402
from tests.test_hot_path import STEP_SYSCALLS  # noqa: E402
from tests.test_hot_path import SYSCALL_COUNTER  # noqa: E402

#: Each feature's modules: none may be imported by a run that does not use the feature.
FEATURES: dict[str, tuple[str, ...]] = {
    "permission modes and approvals": ("dsh.tools.approval", "dsh.tools.plan"),
    # (``dsh --help`` imports the commands' own modules, ``dsh.cli.commands.permissions`` and
    # ``…trust``, for their short help: tests/test_hot_path.py pins them; not what they use)
    "grants": ("dsh.tools.grants",),
    "trust digests of project files": ("dsh.config.trust", "hashlib"),
    "the session index and its full-text search": ("dsh.ledger.index", "dsh.ledger.search",
                                                    "sqlite3", "_sqlite3"),
    "dsh-shell's workbench tools": tuple(f"dsh_shell.{m}" for m in (
        "edit", "patch", "search", "grep", "walk", "jobs", "syntax", "ask")),
}

ROOT = str(Path(__file__).resolve().parent.parent)


def _env(home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DSH_", "COV_", "COVERAGE"))}
    env.update(DSH_HOME=str(home), XDG_CONFIG_HOME=str(home), DSH_LOAD_PLUGINS="shell",
               PYTHONPATH=os.pathsep.join([ROOT, env.get("PYTHONPATH", "")]).rstrip(os.pathsep))
    return env


def _imported(tmp_path: Path, *argv: str) -> set[str]:
    home, empty = tmp_path / "home", tmp_path / "empty"
    home.mkdir(exist_ok=True)
    empty.mkdir(exist_ok=True)
    out = tmp_path / "probe.json"
    r = subprocess.run([sys.executable, "-c", PROBE, str(out), *argv], env=_env(home),
                       cwd=empty, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return set(json.loads(out.read_text())["modules"])


def _check_features(found: set[str], where: str) -> None:
    gained = {feature: sorted(set(modules) & found) for feature, modules in FEATURES.items()}
    gained = {k: v for k, v in gained.items() if v}
    assert not gained, (
        f"{where}, which uses none of these features, imported {gained}: an unused feature "
        "must cost a run nothing. Import the module inside the function that uses it "
        "(tests/test_hot_path_features.py)")


@pytest.mark.parametrize("argv", [("run", "-m", "echo", "hi"), ("--help",), ("--version",)],
                         ids=["run", "help", "version"])
def test_unused_features_import_nothing_at_start_up(tmp_path: Path, argv: tuple[str, ...]) -> None:
    found = _imported(tmp_path, *argv)
    assert "dsh" in found  # the probe did run dsh
    _check_features(found, f"`dsh {' '.join(argv)}`")


#: A plain tool step with the workbench registered and unused: what it imports and builds
#: during the counted turns, and its system calls on the ledger per step.
STEP = r"""
import gc, json, os, sys, tempfile
sys.path.insert(0, sys.argv[2])
from benchmarks._common import bench_app, tool_loop_script
from dsh.llm.builtin import ScriptedModel
""" + SYSCALL_COUNTER + r"""
import attr._make
built = []
real_build = attr._make._ClassBuilder.build_class

def build_class(self):  # every attrs class made, wherever and however often
    if counting:
        built.append(f"{self._cls.__module__}.{self._cls.__qualname__}")
    return real_build(self)

attr._make._ClassBuilder.build_class = build_class

def run(steps):
    global counting
    for v in calls.values():
        v.clear()
    app = bench_app(tempfile.mkdtemp(), fsync=fsync, load=("dsh_shell",),
                    plugins={"shell": {"workspace": tempfile.mkdtemp()}})
    agent = app.agent(model="echo")
    assert "edit_file" in agent.tools and "noop" in agent.tools, sorted(agent.tools)
    agent._model = ScriptedModel("", {"responses": tool_loop_script(steps) * 2})
    with app.open_session(agent) as s:
        fd = s.ledger._fd
        before = set(sys.modules)
        s.send("warm")  # lazy imports and caches of the first turn
        first = set(sys.modules) - before
        counting = True
        result = s.send("go")
        counting = False
        later = set(sys.modules) - before - first
    assert result.outcome == "completed" and result.steps == steps, result.reason
    counts = {k: (len([x for x in v if x == fd]) if k != "open" else len(v))
              for k, v in calls.items()}
    return counts, first, later

built.clear()
(a, fa, la), (b, fb, lb) = run(10), run(20)
print(json.dumps({"per_step": {k: (b[k] - a[k]) / 10 for k in a},
                  "first_turn": sorted(fa | fb), "modules": sorted(la | lb),
                  "classes": sorted(set(built))}))
"""

#: What the first tool-calling turn of a session imports (after the session was opened),
#: each with why; nothing of the unused features. (The tool's result carries no changes and
#: its one call runs in this thread: no ``dsh.tools.changes``, no ``concurrent.futures``.)
FIRST_TURN_MODULES = {
    # the model's facts (price, context window), read at the first request
    "dsh.core.modeldata",
    # a tool call's arguments checked against its schema, at the first call
    "dsh.tools.validation",
}


@pytest.mark.parametrize("fsync", ["step", "never"])
def test_a_step_with_the_workbench_unused_costs_what_a_plain_step_costs(
        tmp_path: Path, fsync: str) -> None:
    r = subprocess.run([sys.executable, "-c", STEP, fsync, ROOT], capture_output=True,
                       text=True, timeout=180, cwd=tmp_path,
                       env={**_env(tmp_path), "DSH_LOAD_PLUGINS": "shell"})
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    first = {m for m in data["first_turn"] if not m.startswith(("coverage", "_pytest"))}
    assert first == FIRST_TURN_MODULES, (
        f"the first tool turn of a session imported {sorted(first - FIRST_TURN_MODULES)} "
        f"(and no longer {sorted(FIRST_TURN_MODULES - first)}): every session's first step "
        "pays for it; keep it where it is used, or pin it in FIRST_TURN_MODULES with why")
    assert not data["modules"], (
        f"a tool step (after the first turn) imported {data['modules']}: a step imports "
        "nothing; import it at start-up if every step needs it, or where it is used")
    assert not data["classes"], (
        f"a tool step built the attrs classes {data['classes']}: a step builds no class "
        "(attrs generates and compiles its methods every time)")
    assert data["per_step"] == STEP_SYSCALLS[fsync], (
        f"a tool step with dsh-shell's workbench registered and unused, fsync={fsync!r}, "
        f"makes {data['per_step']} system calls on the ledger; a plain step makes "
        f"{STEP_SYSCALLS[fsync]} (tests/test_hot_path.py): unused tools cost a step nothing")
