"""The plugin pages tell the truth: their file blocks are the files of docs/examples/ and of
examples/dsh-example/, the example distributions install with pip and are found through their
entry points, and their tools, prompt fragment, hooks, tests, command-line output and wrappers
do what the text says (dsh-example's own tests run in tests/test_testing_plugin.py, from a
fresh environment where it is installed).

A block is tied to a file by the line before its opening fence: ```PATH`:`` means the block
is the whole file; ```PATH` (excerpt):`` means its lines appear, consecutively, in the file.
"""

from __future__ import annotations

import difflib
import importlib.metadata
import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from typing import NamedTuple

import pytest

from dsh.ledger.events import StepRejected
from dsh.ledger.events import ToolReturned
from dsh.ledger.events import TurnStarted
from dsh.ledger.events import UserMessage
from dsh.run.app import App

REPO = Path(__file__).resolve().parents[1]
#: The pages that show the example files (docs/plugin-tutorial.md, whose plugin lives in the
#: page itself, is tests/test_docs_tutorial.py's).
DOCS = [REPO / "docs" / page for page in ("plugin-examples.md", "plugin-hooks.md",
                                          "plugin-state.md")]
EXAMPLES = REPO / "docs" / "examples"
EXAMPLE = EXAMPLES / "dsh-wordcount"
#: The complete plugin of section 8 (its README is not shown: it points to the tutorial).
COMPLETE = REPO / "examples" / "dsh-example"
_TAG = re.compile(r"^`(?P<path>(?:docs/)?examples/[^`]+)`(?P<excerpt> \(excerpt\))?:$")
_IGNORED = {"__pycache__", "build", ".pytest_cache"}


class Block(NamedTuple):
    """A fenced code block of the tutorial."""

    line: int  # of the opening fence, 1-based
    lang: str
    text: str
    path: str | None  # the file it is tied to
    excerpt: bool
    doc: str = "docs"  # the page, for messages


def blocks() -> list[Block]:
    return [b for doc in DOCS for b in _blocks(doc)]


def _blocks(doc: Path) -> list[Block]:
    found = []
    name = str(doc.relative_to(REPO))
    lines = doc.read_text(encoding="utf-8").splitlines(keepends=True)
    i = 0
    while i < len(lines):
        if not lines[i].startswith("```"):
            i += 1
            continue
        start, lang = i, lines[i][3:].strip()
        i += 1
        while i < len(lines) and lines[i].rstrip("\n") != "```":
            i += 1
        assert i < len(lines), f"{name}:{start + 1}: unclosed code block"
        before = next((ln.strip() for ln in reversed(lines[:start]) if ln.strip()), "")
        tag = _TAG.match(before)
        found.append(Block(start + 1, lang, "".join(lines[start + 1:i]),
                           tag["path"] if tag else None, bool(tag and tag["excerpt"]), name))
        i += 1
    return found


def example_files() -> list[Path]:
    return sorted(
        p for root in (EXAMPLES, COMPLETE) for p in root.rglob("*")
        if p.is_file() and p != COMPLETE / "README.md" and not any(
            part in _IGNORED or part.startswith(".") or part.endswith(".egg-info")
            for part in p.relative_to(root).parts)  # caches and build leftovers
    )


# --------------------------------------------------------------------------------------------
# The text and the files agree
# --------------------------------------------------------------------------------------------


def test_file_blocks_are_the_example_files() -> None:
    tagged = [b for b in blocks() if b.path]
    assert len(tagged) >= 8, "the tutorial lost its file blocks"
    assert sum(1 for b in tagged if (b.path or "").startswith("examples/dsh-example/")) >= 10, (
        "the complete plugin lost its file blocks")
    for b in tagged:
        assert b.path is not None
        path = REPO / b.path
        assert path.is_file(), f"{b.doc}:{b.line}: no file {b.path}"
        text = path.read_text(encoding="utf-8")
        if b.excerpt:
            assert ("\n" + text).find("\n" + b.text) >= 0, (
                f"{b.doc}:{b.line}: this excerpt is not in {b.path}; copy it from there")
        else:
            diff = "".join(difflib.unified_diff(
                text.splitlines(keepends=True), b.text.splitlines(keepends=True),
                b.path, f"{b.doc}:{b.line}"))
            assert b.text == text, f"the tutorial's copy of {b.path} differs:\n{diff}"


def test_every_example_file_is_shown_in_full() -> None:
    shown = {b.path for b in blocks() if b.path and not b.excerpt}
    missing = [str(p.relative_to(REPO)) for p in example_files()
               if str(p.relative_to(REPO)) not in shown]
    assert not missing, f"the plugin pages do not show these files: {missing}"


def test_code_blocks_are_valid() -> None:
    for b in blocks():
        where = f"{b.doc}:{b.line}"
        if b.lang == "python":
            compile(textwrap.dedent(b.text), where, "exec")
        elif b.lang == "toml":
            tomllib.loads(b.text)
        elif b.lang == "json":
            json.loads(b.text)


# --------------------------------------------------------------------------------------------
# The example distribution, really installed
# --------------------------------------------------------------------------------------------


def _builds_offline() -> bool:
    """Whether pip can build with this environment's setuptools (no build isolation): it
    needs setuptools ≥ 70.1, or an older one plus ``wheel``."""
    try:
        version = importlib.metadata.version("setuptools")
    except importlib.metadata.PackageNotFoundError:
        return False
    major, minor = (int(x) for x in re.findall(r"\d+", version)[:2])
    if (major, minor) >= (70, 1):
        return True
    try:
        importlib.metadata.version("wheel")
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """``pip install --target`` of a copy of the example (a build in the source tree would
    leave build/ and *.egg-info/ in docs/examples); returns the target directory."""
    root = tmp_path_factory.mktemp("wordcount")
    src = root / "src"
    shutil.copytree(EXAMPLE, src, ignore=shutil.ignore_patterns(*_IGNORED, "*.egg-info", ".*"))
    target = root / "site"
    cmd = [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-input",
           "--disable-pip-version-check", "--target", str(target), str(src)]
    if _builds_offline():
        cmd.insert(4, "--no-build-isolation")
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, f"{' '.join(cmd)} failed:\n{proc.stdout}\n{proc.stderr}"
    yield target
    sys.modules.pop("dsh_wordcount", None)


@pytest.fixture
def site(installed: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The installed example on sys.path, discovered afresh by this test."""
    monkeypatch.syspath_prepend(str(installed))
    monkeypatch.delitem(sys.modules, "dsh_wordcount", raising=False)
    monkeypatch.delenv("DSH_LOAD_PLUGINS", raising=False)
    return installed


def example_app(tmp_path: Path, responses: list[dict[str, Any]], **extra: Any) -> App:
    """The tutorial's own dsh.toml, with sessions in tmp and a scripted model."""
    config = tomllib.loads((EXAMPLE / "dsh.toml").read_text())
    config["sessions_dir"] = str(tmp_path / "sessions")
    config["models"] = {"fake": {"adapter": "scripted", "responses": responses}}
    config.update(extra)
    return App.from_config(config)


def test_example_is_found_through_its_entry_point(site: Path, tmp_path: Path) -> None:
    app = example_app(tmp_path, [])
    record = next((r for r in app.plugins if r.name == "wordcount"), None)
    assert record is not None, [r.label for r in app.plugins]
    assert (record.dist, record.version, record.module, record.error) == (
        "dsh-wordcount", "0.1.0", "dsh_wordcount", None)
    assert Path(record.obj.__file__).parent == site  # the installed copy, not docs/examples
    writer, chat = app.agent("writer"), app.agent("chat")
    assert list(writer.tools) == ["count_words"] and not chat.tools
    assert writer.tools["count_words"].plugin == "wordcount"
    assert writer.system == ("You are a careful editor.\n\n"
                             "To count words, call count_words; never count by hand.")


def test_example_tool_and_pre_step_in_a_scripted_run(site: Path, tmp_path: Path) -> None:
    call = {"name": "count_words", "arguments": {"text": "The cat and the hat, the end"}}
    app = example_app(tmp_path, [{"tool_calls": [call]}, {"text": "7 words."}])
    secret = "sk-" + "a1B2" * 8
    run = app.run(f"Count these, my key is {secret}", agent="writer", model="fake")
    assert (run.outcome, run.output) == ("completed", "7 words.")
    events = app.store.read(run.session_id)
    [message] = [e for e in events if isinstance(e, UserMessage)]
    assert message.text == "Count these, my key is [redacted API key]"
    [result] = [e for e in events if isinstance(e, ToolReturned)]
    assert result.status == "ok"
    assert json.loads(result.output) == {  # top = 5 from [plugins.wordcount]
        "words": 7, "distinct": 5,
        "most_common": [["the", 3], ["cat", 1], ["and", 1], ["hat", 1], ["end", 1]]}
    [start] = [e for e in events if isinstance(e, TurnStarted)]
    assert start.system is not None and "call count_words" in start.system
    assert run.path is not None and secret not in run.path.read_text()

    # chat does not enable the plugin: neither the tool nor the redaction reach it.
    app = example_app(tmp_path, [{"tool_calls": [call]}, {"text": "?"}])
    run = app.run(f"key {secret}", agent="chat", model="fake")
    events = app.store.read(run.session_id)
    assert [e.text for e in events if isinstance(e, UserMessage)] == [f"key {secret}"]
    assert [(e.status, e.output) for e in events if isinstance(e, ToolReturned)] == [
        ("error", "unknown tool 'count_words'")]


def _env(site: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DSH_")}
    env.update(PYTHONPATH=os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")]),
               PYTHONDONTWRITEBYTECODE="1", **extra)
    return env


def test_example_tests_pass(site: Path, tmp_path: Path) -> None:
    """The tutorial's test file, run as its reader would run it."""
    shutil.copy(EXAMPLE / "test_wordcount.py", tmp_path)
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--rootdir",
         str(tmp_path), "test_wordcount.py"],
        cwd=tmp_path, env=_env(site, DSH_HOME=str(tmp_path / "home")), capture_output=True,
        text=True, timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "5 passed" in proc.stdout


def test_console_output_shown_is_what_dsh_prints(site: Path, tmp_path: Path) -> None:
    """`dsh plugins` and `dsh tools` with the tutorial's config print what the text shows
    (only the example plugin is loaded, so other installed plugins do not appear)."""
    checked = 0
    for b in blocks():
        first, _, shown = b.text.partition("\n")
        if b.lang != "console" or first not in ("$ dsh plugins", "$ dsh tools"):
            continue
        env = _env(site, DSH_CONFIG=str(EXAMPLE / "dsh.toml"), DSH_LOAD_PLUGINS="wordcount",
                   DSH_HOME=str(tmp_path / "home"))
        proc = subprocess.run([sys.executable, "-m", "dsh", *first.split()[2:]], env=env,
                              capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout == shown, (
            f"{b.doc}:{b.line}: `{first[2:]}` now prints:\n{proc.stdout}\n"
            "update the tutorial")
        checked += 1
    assert checked == 2


@pytest.fixture(scope="module")
def complete_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``pip install --target`` of a copy of examples/dsh-example; the target directory."""
    root = tmp_path_factory.mktemp("complete")
    src = root / "src"
    shutil.copytree(COMPLETE, src, ignore=shutil.ignore_patterns(*_IGNORED, "*.egg-info", ".*"))
    target = root / "site"
    cmd = [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-input",
           "--disable-pip-version-check", "--target", str(target), str(src)]
    if _builds_offline():
        cmd.insert(4, "--no-build-isolation")
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, f"{' '.join(cmd)} failed:\n{proc.stdout}\n{proc.stderr}"
    return target


def test_complete_plugin_console_output_is_what_dsh_prints(complete_site: Path,
                                                           tmp_path: Path) -> None:
    """Section 8's `dsh --config dsh.toml plugins` / `tools`, run in examples/dsh-example."""
    checked = 0
    prefix = "$ dsh --config dsh.toml "
    for b in blocks():
        first, _, shown = b.text.partition("\n")
        if b.lang != "console" or not first.startswith(prefix):
            continue
        env = _env(complete_site, DSH_LOAD_PLUGINS="example", DSH_HOME=str(tmp_path / "home"))
        proc = subprocess.run([sys.executable, "-m", "dsh", *first.split()[2:]], env=env,
                              cwd=COMPLETE, capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout == shown, (
            f"{b.doc}:{b.line}: `{first[2:]}` now prints:\n{proc.stdout}\n"
            "update the tutorial")
        checked += 1
    assert checked == 2


def test_timing_wrappers_wrap_the_onion_in_order(
        site: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """docs/examples/dsh_timing.py, loaded with `load` as the reference suggests."""
    monkeypatch.syspath_prepend(str(EXAMPLES))
    monkeypatch.setattr(sys, "dont_write_bytecode", True)
    monkeypatch.delitem(sys.modules, "dsh_timing", raising=False)
    call = {"name": "count_words", "arguments": {"text": "one two"}}
    app = example_app(
        tmp_path, [{"tool_calls": [call]}, {"text": "2"}], load=["dsh_timing"],
        agents={"writer": {"plugins": ["wordcount", "dsh_timing"]}},
    )
    run = app.run("count", agent="writer", model="fake")
    assert run.outcome == "completed"
    lines = [re.sub(r"\d+\.\d+", "N", ln) for ln in capsys.readouterr().err.splitlines()]
    assert lines == [
        "[timing] writer: model answered in Ns",
        "[timing] count_words: start",
        "[timing] count_words: pre_execute",
        "[timing] count_words: post_execute",
        "[timing] count_words: ok in N ms",
        "[timing] writer: model answered in Ns",
    ]

    # An error inside is reported on the way out, and not swallowed: the run fails.
    app = example_app(tmp_path, [{"error": "overloaded", "status": 529}], load=["dsh_timing"],
                      agents={"writer": {"plugins": ["dsh_timing"]}})
    run = app.run("count", agent="writer", model="fake")
    assert run.outcome == "error" and "overloaded" in run.reason
    assert capsys.readouterr().err.startswith(
        "[timing] writer: request failed after ")


def test_rejection_records_the_original_text(site: Path, tmp_path: Path,
                                             plugin_module: Any) -> None:
    """step/rejected keeps the rejected text, with secrets redacted (dsh.redact): here a key
    of a well-known shape that dsh itself does not know."""
    from dsh.hookspecs import hookimpl

    @hookimpl
    def pre_step(step: Any) -> None:
        step.reject("contains a key")

    guard = plugin_module(pre_step=pre_step)
    app = example_app(tmp_path, [{"text": "never"}], load=[guard],
                      agents={"writer": {"plugins": [guard]}})
    run = app.run("my key sk-0123456789abcdefghijkl", agent="writer", model="fake")
    assert run.outcome == "rejected"
    [rejected] = [e for e in app.store.read(run.session_id) if isinstance(e, StepRejected)]
    assert (rejected.reason, rejected.plugin) == ("contains a key", guard)  # its registered name
    assert rejected.text == "my key [redacted]"
