"""Guards on the hot path (issue 27): deterministic counts, never timings.

Start-up is import cost and a step's cost is its system calls and the objects it builds, so
these tests pin what can be counted exactly, each in a fresh process:

* the modules ``dsh run -m echo hi`` (dsh-shell the one plugin loaded) and ``dsh --help``
  import, beyond what ``python -c pass`` has already imported, in the same interpreter and
  environment;
* the attrs classes that exist after that run (every class carrying ``__attrs_attrs__`` found
  by ``gc.get_objects()``: a class built at import or on the way, wherever it was made);
* the ``os.write``, ``os.fsync``/``os.fdatasync`` and ``os.fstat`` calls on the session
  ledger's file descriptor, and the files opened (``sys.addaudithook``'s ``open`` event), per
  plain tool step: counted over a 20-step and a 10-step turn and divided by the difference,
  so per-turn costs cancel. ``os.write``/``os.fsync`` raise no audit event, so they are
  counted by wrapping the ``os`` functions (dsh.ledger.writer calls them through the module).

A new entry fails the test with a message naming it: add it to the allowlist *with the reason
the plain path needs it* (and, if it costs time, the figure from ``benchmarks/startup.py``), or
keep it off the path (import inside the function that uses it). An entry that disappears
fails too, so the pin stays exact: delete it from the list.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("dsh_shell")

#: Modules other than dsh's imported by ``dsh run -m echo hi`` with dsh-shell, beyond
#: ``python -c pass``'s own: stdlib modules by full name, third-party ones by package (their
#: submodules are their business). Pinned exactly (Python 3.11, as CI).
RUN_MODULES_OTHER = {
    # dsh's dependencies: click (the CLI), attrs (the data classes), pluggy (plugins)
    "click", "attr", "attrs", "pluggy",
    # imported by click at its own import: inspect (ast, dis, tokenize, linecache…) for
    # signatures, uuid (and platform) and datetime by click.types, gettext and locale for its
    # messages, threading, typing
    "_ast", "_datetime", "_locale", "_opcode", "_typing", "_uuid", "_weakrefset", "ast",
    "collections.abc", "datetime", "dis", "gettext", "inspect", "linecache", "locale", "math",
    "opcode", "platform", "threading", "token", "tokenize", "typing", "typing.io", "typing.re",
    "uuid", "weakref",
    # click's parser tries "-m" as a long option first; its NoSuchOption computes close
    # matches with difflib (and heapq) even though the short option then matches
    "difflib", "_heapq", "heapq",
    # attrs: copy
    "copy",
    # the ledger: JSON lines, fcntl locks (dsh.ledger.store)
    "_json", "json", "json.decoder", "json.encoder", "json.scanner", "fcntl",
    # dsh.ledger.scan pauses the cyclic collector while it builds a file's events (gc is
    # built into the interpreter: importing it runs no code)
    "gc",
    # the run context (dsh.host.runcontext)
    "_contextvars", "contextvars",
    # dsh.core.sanitize: unicodedata categories of control characters
    "unicodedata",
    # dsh-shell: shlex to split commands, signal to stop them
    "shlex", "signal",
}

#: Modules other than dsh's imported by ``dsh --help``: click's, and click's help formatter
#: (textwrap; shutil.get_terminal_size, and shutil's compression modules).
HELP_MODULES_OTHER = {
    "click", "_ast", "_datetime", "_locale", "_opcode", "_typing", "_uuid", "_weakrefset",
    "ast", "collections.abc", "datetime", "dis", "gettext", "inspect", "linecache", "locale",
    "math", "opcode", "platform", "threading", "token", "tokenize", "typing", "typing.io",
    "typing.re", "uuid", "weakref",
    "textwrap", "shutil", "_bz2", "_compression", "_lzma", "bz2", "lzma", "zlib",
}


def _child(code: str, *args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code, *args], env=env, capture_output=True,
                          text=True, timeout=120)


#: Runs dsh's ``main`` with argv, then writes (modules added, attrs classes alive) as JSON.
#: Only builtins are used after the baseline snapshot, so the dump adds no module of its own.
PROBE = r"""
import sys
before = set(sys.modules)
out = sys.argv[1]
sys.argv = ["dsh", *sys.argv[2:]]
try:
    from dsh.cli.root import main
    main()
except SystemExit:
    pass
finally:
    added = sorted(set(sys.modules) - before)
    import gc, json
    classes = sorted({f"{c.__module__}.{c.__qualname__}" for c in gc.get_objects()
                      if isinstance(c, type) and "__attrs_attrs__" in c.__dict__})
    with open(out, "w") as f:
        json.dump({"modules": added, "attrs_classes": classes}, f)
"""


def _probe(tmp_path: Path, *argv: str) -> dict[str, list[str]]:
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DSH_", "COV_", "COVERAGE"))}
    env.update(DSH_HOME=str(home), XDG_CONFIG_HOME=str(home), DSH_LOAD_PLUGINS="shell")
    out = tmp_path / "probe.json"
    r = _child(PROBE, str(out), *argv, env=env)
    assert r.returncode == 0, r.stderr
    base = _child("import sys; print('\\n'.join(sorted(sys.modules)))", env=env)
    data = json.loads(out.read_text())
    baseline = set(base.stdout.split())
    data["modules"] = [m for m in data["modules"] if m not in baseline
                       and not m.startswith(("coverage", "_pytest", "pytest", "__editable__"))]
    return data


def _check(found: set[str], allowed: set[str], what: str, where: str) -> None:
    new = sorted(found - allowed)
    assert not new, (
        f"{what} {where} gained {new}: each costs start-up for every user. Keep it off the "
        f"plain path (import it where it is used), or add it to {where}'s allowlist in "
        "tests/test_hot_path.py with the reason the plain path needs it "
        "(and benchmarks/startup.py's figure before and after)")
    gone = sorted(allowed - found)
    assert not gone, f"{what} {where} no longer has {gone}: remove them from the allowlist"


#: dsh's own modules on ``dsh run -m echo hi`` (with dsh-shell): pinned exactly.
RUN_MODULES_DSH = {
    "dsh", "dsh._compat", "dsh._version", "dsh.cli", "dsh.cli.escape", "dsh.cli.options",
    "dsh.cli.root", "dsh.cli.run_command", "dsh.cli.shared", "dsh.cli.status",
    "dsh.cli.streams", "dsh.cli.terminal", "dsh.config", "dsh.config.finite",
    "dsh.config.loader", "dsh.core", "dsh.core.errors", "dsh.core.escape", "dsh.core.files",
    "dsh.core.messages",
    "dsh.core.modeldata", "dsh.core.redact", "dsh.core.sanitize", "dsh.hookspecs", "dsh.host",
    "dsh.host.manager", "dsh.host.runcontext", "dsh.host.scope", "dsh.host.stash",
    "dsh.ledger", "dsh.ledger.blobs", "dsh.ledger.events", "dsh.ledger.history",
    "dsh.ledger.owners", "dsh.ledger.plugin_events", "dsh.ledger.scan", "dsh.ledger.serialize",
    # the nested parts of a line (tool calls, usage, changes…): serialize's, split off it
    "dsh.ledger.parts",
    # the projection's one-pass folds of a step's lines (every run writes and folds them)
    "dsh.ledger.folds",
    "dsh.ledger.state",
    "dsh.ledger.store", "dsh.ledger.writer", "dsh.llm", "dsh.llm.base", "dsh.llm.builtin",
    "dsh.llm.invariant", "dsh.llm.record", "dsh.llm.schema", "dsh.llm.transport", "dsh.run",
    "dsh.run.agent", "dsh.run.app", "dsh.run.budget", "dsh.run.compaction",
    "dsh.run.compaction.estimate", "dsh.run.compaction.strategies",
    "dsh.run.compaction.summary", "dsh.run.compaction.trigger", "dsh.run.loop",
    "dsh.run.memory", "dsh.run.prompt", "dsh.run.recorder", "dsh.run.result",
    "dsh.run.session", "dsh.run.subagent", "dsh.run.tasks", "dsh.run.turn", "dsh.sandbox",
    "dsh.sandbox.policy", "dsh.tools", "dsh.tools.dispatch", "dsh.tools.registry",
    "dsh_shell", "dsh_shell.commands", "dsh_shell.process", "dsh_shell.settings",
    "dsh_shell.workspace",
    # the workbench's signatures and docstrings only; each tool imports its module when called
    "dsh_shell.workbench",
}

#: dsh's own modules on ``dsh --help``: no plugin, no run machinery.
HELP_MODULES_DSH = {
    "dsh", "dsh._compat", "dsh._version", "dsh.cli", "dsh.cli.root", "dsh.cli.options",
    "dsh.cli.run_command", "dsh.cli.shared", "dsh.core", "dsh.core.errors",
    # each command's module, for its short help in the list
    "dsh.cli.commands", *(f"dsh.cli.commands.{c}" for c in (
        "batch", "chat", "config", "doctor", "install", "inventory", "keys", "permissions",
        "replay", "sandbox", "sessions", "trust")),
    # fork and rewind are commands of the sessions group, defined in their own module
    "dsh.cli.commands.session_tree",
}

#: attrs classes alive after ``dsh run -m echo hi``: attrs' own, then dsh's. Each costs
#: about 0.25 ms at import (attrs generates and compiles its methods).
RUN_ATTRS_CLASSES = {
    "attr._make._CountingAttr", "attr._make._AndValidator", "attr._version_info.VersionInfo",
    *(f"attr.validators.{n}" for n in (
        "_InstanceOfValidator", "_MatchesReValidator", "_OptionalValidator", "_InValidator",
        "_IsCallableValidator", "_DeepIterable", "_DeepMapping", "_NumberValidator",
        "_MaxLengthValidator", "_MinLengthValidator", "_SubclassOfValidator", "_NotValidator",
        "_OrValidator")),
    # the data of the public API and of the ledger's events
    *(f"dsh.core.messages.{n}" for n in (
        "ToolCall", "Usage", "Reasoning", "Attachment", "Message", "ToolSpec", "ModelRequest",
        "ModelResponse",
        # a tool result's recorded diff: a field of ToolReturned, so built with it
        "Change",
        # a user message's ``-f`` fragment references: a field of UserMessage, so built with it
        "FragmentRef")),
    *(f"dsh.ledger.events.{n}" for n in (
        "Event", "TurnStarted", "StepStarted", "UserMessage", "ContextInjected",
        "AssistantMessage", "ToolCalled", "ToolReturned", "StepRejected", "StepEnded",
        "TurnEnded", "ContextCompacted", "UnknownEvent", "PluginEvent",
        # the first line of a fork: the codec reads every tag of any ledger it may resume
        "SessionForked")),
    "dsh.run.result.RunResult", "dsh.host.runcontext.Limits", "dsh.host.runcontext.Budget",
    "dsh.host.runcontext.RunContext", "dsh.config.loader.AgentConfig",
    "dsh.config.loader.Config", "dsh.host.manager.PluginRecord", "dsh.llm.base.ModelEntry",
    "dsh.host.scope.AgentHandle", "dsh.run.prompt.PromptPart",
    "dsh.tools.registry.ToolDef", "dsh.tools.registry.ToolOutcome",
    "dsh.tools.registry.ToolInvocation", "dsh.ledger.store.SessionInfo",
    "dsh.run.recorder.LiveEvent", "dsh.run.turn.InboxItem", "dsh.run.turn.StepDraft",
    "dsh.run.turn.Turn", "dsh.run.app.DefaultModel", "dsh_shell.settings.ShellSettings",
    "dsh.sandbox.policy.Policy", "dsh.sandbox.policy.Plan",
    "dsh.run.compaction.strategies.Compaction",
    "dsh.run.compaction.strategies.CompactionRequest", "dsh.core.modeldata.Price",
    "dsh.core.modeldata.ModelFacts",
}


def _split(modules: list[str]) -> tuple[set[str], set[str]]:
    """(dsh's and dsh-shell's modules, the others: stdlib by name, third-party by package)."""
    own = {m for m in modules if m == "dsh" or m.startswith(("dsh.", "dsh_shell"))}
    other = set()
    for m in set(modules) - own:
        top = m.partition(".")[0]
        other.add(m if top in sys.stdlib_module_names else top)
    return own, other


def test_dsh_run_imports_only_the_pinned_modules(tmp_path: Path) -> None:
    data = _probe(tmp_path, "run", "-m", "echo", "hi")
    own, other = _split(data["modules"])
    _check(own, RUN_MODULES_DSH, "dsh's modules imported by", "`dsh run -m echo hi`")
    _check(other, RUN_MODULES_OTHER, "the other modules imported by", "`dsh run -m echo hi`")


def test_dsh_help_imports_only_the_pinned_modules(tmp_path: Path) -> None:
    data = _probe(tmp_path, "--help")
    own, other = _split(data["modules"])
    _check(own, HELP_MODULES_DSH, "dsh's modules imported by", "`dsh --help`")
    _check(other, HELP_MODULES_OTHER, "the other modules imported by", "`dsh --help`")
    assert not data["attrs_classes"], "`dsh --help` builds no attrs class"


def test_dsh_run_builds_only_the_pinned_attrs_classes(tmp_path: Path) -> None:
    data = _probe(tmp_path, "run", "-m", "echo", "hi")
    _check(set(data["attrs_classes"]), RUN_ATTRS_CLASSES, "the attrs classes built by",
           "`dsh run -m echo hi`")
    assert len(data["attrs_classes"]) == len(RUN_ATTRS_CLASSES)


#: One plain tool step's system calls on the ledger, per fsync policy.
STEP_SYSCALLS = {
    # five events (step/start, assistant, tool/call, tool/return, step/end), one write(2)
    # each; one fsync at the step boundary; one fstat to notice a deleted ledger
    "step": {"write": 5, "fsync": 1, "fstat": 1, "open": 0},
    "never": {"write": 5, "fsync": 0, "fstat": 1, "open": 0},
}

#: The start of a step-counting child script: ``fsync`` from argv[1], and ``calls``: the
#: write/fsync/fstat calls on each descriptor and the files opened while ``counting``.
SYSCALL_COUNTER = r"""
fsync = sys.argv[1]
calls = {"write": [], "fsync": [], "fstat": [], "open": []}
counting = False

def wrap(name, key):
    real = getattr(os, name)
    def counted(fd, *a):
        if counting:
            calls[key].append(fd)
        return real(fd, *a)
    setattr(os, name, counted)

wrap("write", "write"); wrap("fsync", "fsync"); wrap("fdatasync", "fsync")
wrap("fstat", "fstat")

def hook(event, args):
    if counting and event == "open":
        calls["open"].append(str(args[0]))
sys.addaudithook(hook)
"""

STEPS = r"""
import json, os, sys, tempfile
sys.path.insert(0, sys.argv[2])
from benchmarks._common import bench_app, tool_loop_script
from dsh.llm.builtin import ScriptedModel
""" + SYSCALL_COUNTER + r"""
def run(steps):
    global counting
    for v in calls.values():
        v.clear()
    app = bench_app(tempfile.mkdtemp(), fsync=fsync)
    agent = app.agent(model="echo")
    # two turns of ``steps``: the first warms lazy imports and caches, the second is counted
    agent._model = ScriptedModel("", {"responses": tool_loop_script(steps) * 2})
    with app.open_session(agent) as s:
        fd = s.ledger._fd
        s.send("warm")
        counting = True
        result = s.send("go")
        counting = False
    assert result.outcome == "completed" and result.steps == steps, result.reason
    return {k: (len([x for x in v if x == fd]) if k != "open" else len(v))
            for k, v in calls.items()}

a, b = run(10), run(20)
print(json.dumps({k: (b[k] - a[k]) / 10 for k in a}))
"""


@pytest.mark.parametrize("fsync", ["step", "never"])
def test_a_plain_tool_step_makes_the_pinned_system_calls(fsync: str) -> None:
    root = str(Path(__file__).resolve().parent.parent)
    r = subprocess.run([sys.executable, "-c", STEPS, fsync, root], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    per_step = json.loads(r.stdout)
    assert per_step == STEP_SYSCALLS[fsync], (
        f"a plain tool step with fsync={fsync!r} now makes {per_step} system calls on the "
        f"ledger (pinned: {STEP_SYSCALLS[fsync]}). Each write/fsync is paid on every step of "
        "every run: justify the change in STEP_SYSCALLS in tests/test_hot_path.py")
