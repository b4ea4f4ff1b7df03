"""The plugin reference pages tell the truth: each page's complete example (the block after a
line ```NAME.py`:``) is loaded as a plugin and does what the page says, every Python block of
the pages compiles, and every link into a docs page names a heading that exists.

The examples run in-process with dsh.testing's fixtures and the scripted model; the sandbox
example starts a real confined ``wc``.
"""

from __future__ import annotations

import json
import re
import sys
import textwrap
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import dsh
from dsh.testing import PromptResult
from dsh.testing import ScriptedApp

REPO = Path(__file__).resolve().parents[1]
DOCS = REPO / "docs"
PAGES = ["plugins.md", "plugin-tutorial.md", "plugin-tools.md", "plugin-hooks.md",
         "plugin-settings.md", "plugin-state.md", "plugin-approvals.md",
         "plugin-processes.md", "plugin-commands.md", "plugin-examples.md"]
_FENCE = re.compile(r"^```([^\n]*)\n(.*?)^```$", re.M | re.S)


def example(page: str, name: str) -> str:
    """The block of ``page`` that follows the line ```NAME`:``."""
    text = (DOCS / page).read_text(encoding="utf-8")
    m = re.search(rf"^`{re.escape(name)}`:\n\n```python\n(.*?)^```$", text, re.M | re.S)
    assert m, f"docs/{page} has no block for {name}"
    return m[1]


@pytest.fixture
def load(monkeypatch: pytest.MonkeyPatch) -> Callable[[str, str], types.ModuleType]:
    """Load a page's example as a module (in sys.modules: attrs resolves its annotations)."""

    def load(page: str, name: str) -> types.ModuleType:
        module = types.ModuleType(name.removesuffix(".py"))
        module.__file__ = f"docs/{page}"
        monkeypatch.setitem(sys.modules, module.__name__, module)
        exec(compile(example(page, name), f"docs/{page}", "exec"), module.__dict__)  # noqa: S102
        return module

    return load


def outputs(result: PromptResult) -> list[tuple[str, str]]:
    """``(status, output)`` of each tool result of the run, in order."""
    return [(e["status"], e["output"]) for e in result.event_dicts if e["type"] == "tool/result"]


# --------------------------------------------------------------------------------------------
# The pages as a whole
# --------------------------------------------------------------------------------------------


def test_every_python_block_of_the_plugin_pages_compiles() -> None:
    for page in PAGES:
        text = (DOCS / page).read_text(encoding="utf-8")
        for m in _FENCE.finditer(text):
            if m[1].split(" ")[0] == "python":
                line = text[:m.start()].count("\n") + 1
                compile(textwrap.dedent(m[2]), f"docs/{page}:{line}", "exec")


def _slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces as hyphens."""
    text = re.sub(r"[`*]", "", heading.strip().lower())
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    text = _FENCE.sub("", path.read_text(encoding="utf-8"))
    return {_slug(h) for h in re.findall(r"^#{1,6} (.+)$", text, re.M)}


def test_links_into_the_plugin_pages_name_headings_that_exist() -> None:
    """Every ``[…](PAGE.md#anchor)`` into a plugin page (from docs/, README.md, the plugins'
    and examples' READMEs), and every such link of a plugin page, lands on a heading
    (GitHub's slugs)."""
    sources = [*DOCS.glob("*.md"), REPO / "README.md", *REPO.glob("plugins/*/README.md"),
               *REPO.glob("examples/*/README.md")]
    bad = []
    for source in sources:
        text = _FENCE.sub("", source.read_text(encoding="utf-8"))
        for target, anchor in re.findall(r"\]\(((?:[\w./-]*/)?[\w.-]+\.md)?#([\w-]+)\)", text):
            page = (source.parent / target).resolve() if target else source
            ours = page.name in PAGES or source.name in PAGES
            if not ours or page.parent != DOCS:
                continue
            if not page.is_file():
                bad.append(f"{source.relative_to(REPO)}: {target} does not exist")
            elif anchor not in _anchors(page):
                bad.append(f"{source.relative_to(REPO)}: {target or source.name}#{anchor}")
    assert not bad, "links to missing headings:\n" + "\n".join(bad)


def test_plugins_md_is_an_index_that_links_every_plugin_page() -> None:
    text = (DOCS / "plugins.md").read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 120
    for page in [*PAGES[1:], "testing-plugins.md", "hooks.md", "security.md"]:
        assert f"]({page})" in text, f"docs/plugins.md does not link {page}"


def test_the_plugin_pages_name_no_tracker_ids() -> None:
    ids = re.compile(r"\bissue \d+|\bMISSION\b|\(\s*[A-G]\d{1,2}\s*\)|(?<![\w/])#\d+\b")
    for page in PAGES:
        text = _FENCE.sub("", (DOCS / page).read_text(encoding="utf-8"))
        assert not ids.findall(text), f"docs/{page}: {ids.findall(text)}"


# --------------------------------------------------------------------------------------------
# plugin-tools.md: dsh_waiter.py, current_call and on_cancel
# --------------------------------------------------------------------------------------------


def test_cancel_on_cancel_contract() -> None:
    """No arguments; once; at once when already fired; the unregister function."""
    token, calls = dsh.CancelToken(), []
    forget = token.on_cancel(lambda: calls.append("first"))
    token.on_cancel(lambda: calls.append("second"))()  # unregistered before it fires
    assert calls == []
    token.cancel("stop")
    token.cancel("again")
    assert (calls, token.cancelled, token.reason) == (["first"], True, "stop")
    forget()  # after it ran: a no-op
    late = token.on_cancel(lambda: calls.append("late"))  # fired already: runs at once
    assert calls == ["first", "late"]
    late()
    with pytest.raises(dsh.Cancelled):
        token.check()


def _waiter_app(make: Callable[..., ScriptedApp], load: Any, ws: Path,
                **plugins: Any) -> ScriptedApp:
    config = {"agent": "w", "agents": {"w": {"plugins": ["waiter", *plugins]}},
              "plugins": {"waiter": {"workspace": str(ws)}}}
    return make(config, plugins={"waiter": load("plugin-tools.md", "dsh_waiter.py"), **plugins})


def test_waiter_finds_a_file_and_names_its_call(dsh_make_app: Callable[..., ScriptedApp],
                                                 load: Any, tmp_path: Path) -> None:
    (tmp_path / "ready.txt").write_text("")
    app = _waiter_app(dsh_make_app, load, tmp_path)
    app.script.tool_call("wait_for_file", name="ready.txt", seconds=5)
    app.script.tool_call("wait_for_file", name="../../etc/passwd").text("done")
    result = app.run("wait")
    [call_id] = [e["call_id"] for e in result.event_dicts if e["type"] == "tool/call"][:1]
    assert outputs(result) == [("ok", f"ready.txt exists (call {call_id})"),
                               ("error", "'../../etc/passwd' is outside the workspace")]


class Aborter:
    """A test plugin: aborts the run just before the waiter's call runs."""

    @dsh.hookimpl
    def pre_execute(self, call: dsh.ToolInvocation) -> None:
        dsh.context().abort("the test aborted it")


def test_waiter_stops_when_the_run_is_aborted(dsh_make_app: Callable[..., ScriptedApp],
                                              load: Any, tmp_path: Path) -> None:
    app = _waiter_app(dsh_make_app, load, tmp_path, aborter=Aborter())
    app.script.tool_call("wait_for_file", name="never.txt", seconds=600).text("unreachable")
    result = app.run("wait")
    assert result.outcome == "aborted", result.reason
    # the ToolError's text, recorded as the result of a call the abort interrupted
    assert outputs(result) == [("interrupted", "the run was aborted; stopped waiting")]


# --------------------------------------------------------------------------------------------
# plugin-state.md: dsh_quota.py
# --------------------------------------------------------------------------------------------


def test_quota_parallel_calls_cannot_overspend(dsh_make_app: Callable[..., ScriptedApp],
                                               load: Any) -> None:
    quota = load("plugin-state.md", "dsh_quota.py")
    app = dsh_make_app({"agent": "w", "agents": {"w": {"plugins": ["quota"]}}},
                       plugins={"quota": quota})
    app.script.tool_calls(("use", {"amount": 2}), ("use", {"amount": 2}), ("use", {"amount": 2}))
    app.script.tool_call("use", amount=0).text("done")
    result = app.run("spend")
    assert sorted(outputs(result)) == [
        ("error", "amount must be at least 1"), ("error", "only 1 of 5 left"),
        ("ok", "spent 2 of 5"), ("ok", "spent 4 of 5")]
    assert result.plugin_events("quota", "spent") == [{"amount": 2}, {"amount": 2}]
    assert app.reopen().state(quota.SPENT, result) == 4  # a new app, from the ledger


def test_a_state_error_carries_the_reducers_own_exception(
        dsh_make_app: Callable[..., ScriptedApp], load: Any) -> None:
    quota = load("plugin-state.md", "dsh_quota.py")
    app = dsh_make_app({"agent": "w", "agents": {"w": {"plugins": ["quota"]}}},
                       plugins={"quota": quota})
    with app.app.session() as session:
        session.update_state(quota.SPENT, {"amount": 5})
        with pytest.raises(dsh.StateError, match="only 0 of 5 left") as caught:
            session.update_state(quota.SPENT, {"amount": 1})
        assert isinstance(caught.value.reducer_error, quota.OverQuota)
        assert caught.value.__cause__ is caught.value.reducer_error
        bad = dsh.StateKey("quota", "bad", 0, lambda state, update: {1, 2})  # not JSON
        with pytest.raises(dsh.StateError, match="not JSON") as refused:
            session.update_state(bad, {})
        assert refused.value.reducer_error is None  # dsh refused the value, not the reducer
        with pytest.raises(dsh.PluginEventError, match="JSON cannot represent"):
            session.update_state(quota.SPENT, {"amount": float("nan")})
        assert session.state(quota.SPENT) == 5
        assert session.plugin_events("quota", "spent")[-1].data == {"amount": 5}


# --------------------------------------------------------------------------------------------
# plugin-approvals.md: dsh_poster.py
# --------------------------------------------------------------------------------------------


def _poster(make: Callable[..., ScriptedApp], load: Any, **settings: Any) -> ScriptedApp:
    return make({"agent": "w", "agents": {"w": {"plugins": ["poster"]}},
                 "plugins": {"poster": settings}},
                plugins={"poster": load("plugin-approvals.md", "dsh_poster.py")})


def _send(app: ScriptedApp, channel: str, **kwargs: Any) -> tuple[list[Any], dict[str, Any]]:
    """One turn posting to ``channel``; the questions the asker got and the decision."""
    asked: list[Any] = []
    answer = kwargs.pop("answer", None)

    def asker(ask: dsh.Ask) -> dsh.Decision:
        asked.append(ask)
        return dsh.Decision(answer, "editor", "the test's dialog")

    mode = kwargs.pop("mode", None)
    app.script.tool_call("post", channel=channel, text="v1.2 is out").text("done")
    with app.app.session(**({"mode": mode} if mode else {})) as session:
        result = session.send("announce it", asker=asker, **kwargs)
    events = [json.loads(line) for line in Path(result.path).read_text().splitlines()]
    [decision] = [e["data"] for e in events if e["type"] == "x/dsh.tools/approval"]
    [returned] = [e for e in events if e["type"] == "tool/result"]
    decision["output"] = returned["output"]
    decision["posted"] = [e["data"] for e in events if e["type"] == "x/poster/posted"]
    return asked, decision


@pytest.mark.parametrize("answer", [True, False])
def test_poster_asks_the_runs_asker(dsh_make_app: Callable[..., ScriptedApp], load: Any,
                                    answer: bool) -> None:
    asked, decision = _send(_poster(dsh_make_app, load), "releases", answer=answer)
    assert [(a.tool, a.action, a.subject, a.detail) for a in asked] == [
        ("post", "outside", "post to releases", "v1.2 is out")]
    assert (decision["allowed"], decision["by"]) == (answer, "editor")
    if answer:
        assert decision["output"] == "posted to releases (allowed by editor)"
        assert decision["posted"] == [{"channel": "releases"}]
    else:
        assert decision["output"].startswith("post was not run: ")
        assert decision["posted"] == []


def test_poster_mode_yes_and_trusted_channels(dsh_make_app: Callable[..., ScriptedApp],
                                              load: Any) -> None:
    app = _poster(dsh_make_app, load, trusted=["releases"])
    asked, decision = _send(app, "general", answer=True, mode="read-only")
    assert (asked, decision["allowed"], decision["by"]) == ([], False, "mode")
    asked, decision = _send(app, "releases", answer=True, mode="read-only")  # cannot widen
    assert (asked, decision["allowed"], decision["by"]) == ([], False, "mode")
    asked, decision = _send(app, "general", answer=False, approve=True)  # --yes
    assert (asked, decision["allowed"], decision["by"]) == ([], True, "yes")
    asked, decision = _send(app, "releases", answer=False)  # pre-approved in pre_execute
    assert (asked, decision["allowed"], decision["by"]) == ([], True, "poster")
    assert decision["output"] == "posted to releases (allowed by poster)"
    asked, decision = _send(app, "general", answer=False)  # not trusted: asked
    assert (len(asked), decision["allowed"]) == (1, False)


# --------------------------------------------------------------------------------------------
# plugin-processes.md: dsh_lines.py
# --------------------------------------------------------------------------------------------


def test_lines_runs_wc_confined_and_records_the_sandbox(
        dsh_make_app: Callable[..., ScriptedApp], load: Any, tmp_path: Path) -> None:
    from dsh.sandbox import SandboxUnavailable
    from dsh.sandbox import check

    try:
        check()
    except SandboxUnavailable as exc:  # pragma: no cover - a kernel without Landlock
        pytest.skip(f"no kernel sandbox here: {exc}")
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "poem.txt").write_text("one\ntwo\nthree\n")
    app = dsh_make_app({"agent": "w", "agents": {"w": {"plugins": ["lines"]}},
                        "plugins": {"lines": {"workspace": str(ws)}}},
                       plugins={"lines": load("plugin-processes.md", "dsh_lines.py")})
    app.sessions_dir.mkdir(parents=True, exist_ok=True)
    secret = app.sessions_dir / "x.jsonl"  # dsh's own data: no command may read it
    secret.write_text("a\n")
    app.script.tool_call("count_lines", path="poem.txt")
    app.script.tool_call("count_lines", path="--help")
    app.script.tool_call("count_lines", path=str(secret)).text("done")
    result = app.run("count")
    (ok, three), (status, _), (denied, why) = outputs(result)
    assert (ok, three) == ("ok", "3")
    assert status == "error"  # "--help" is a file name after "--", and there is none
    assert denied == "error" and "wc failed" in why, why  # dsh's own files: no read
    records = result.plugin_events("lines", "sandbox")
    assert len(records) == 3
    assert records[0]["tool"] == "count_lines" and records[0]["policy"]


# --------------------------------------------------------------------------------------------
# plugin-commands.md: dsh_tally.py
# --------------------------------------------------------------------------------------------


def test_tally_command_reads_the_session_and_escapes_what_it_prints(
        dsh_make_app: Callable[..., ScriptedApp], load: Any) -> None:
    app = dsh_make_app({"agent": "w", "agents": {"w": {"plugins": ["tally"]}}},
                       plugins={"tally": load("plugin-commands.md", "dsh_tally.py")})
    app.script.tool_calls(("tally", {"word": "cat"}), ("tally", {"word": "cat"}))
    app.script.tool_call("tally", word="\x1b[2Jdog").text("done")
    result = app.run("count")
    assert sorted(o for _, o in outputs(result)) == ["\x1b[2Jdog: 1", "cat: 1", "cat: 2"]
    shown = app.cli("tally")
    assert shown.exit_code == 0, shown.stderr
    assert shown.stdout.splitlines()[0] == f"{result.session_id}: 3 words"
    assert "\x1b" not in shown.stdout
    assert "  cat  2" in shown.stdout.splitlines()
    missing = app.cli("tally", "nosuch")
    assert (missing.exit_code, missing.stdout) == (2, "")
    assert missing.stderr.startswith("dsh: error: ") and "nosuch" in missing.stderr


# --------------------------------------------------------------------------------------------
# plugin-settings.md: dsh_greeter.py
# --------------------------------------------------------------------------------------------


def test_greeter_settings_per_agent(dsh_make_app: Callable[..., ScriptedApp], load: Any) -> None:
    greeter = load("plugin-settings.md", "dsh_greeter.py")
    app = dsh_make_app({
        "agents": {"a": {"plugins": ["greeter"]},
                   "b": {"plugins": ["greeter"],
                         "plugin_settings": {"greeter": {"style": "formal"}}}},
        "plugins": {"greeter": {"name": "Ann"}}}, plugins={"greeter": greeter})
    assert app.app.agent("a").system.endswith("Greet the user as: Hi, Ann.")
    assert app.app.agent("b").system.endswith("Greet the user as: Good day, Ann.")
    handle = app.app.agent("b").handle
    assert dsh.settings(greeter.Settings, handle) is dsh.settings(greeter.Settings, handle)


@pytest.mark.parametrize(("table", "agent", "message"), [
    ({"nam": "Ann"}, {}, "unknown key 'plugins.greeter.nam'; did you mean 'name'?"),
    ({"order": "first"}, {}, "key 'plugins.greeter.order': expected an integer"),
    ({}, {"heading": 3}, "unknown key 'agents.a.plugin_settings.greeter.heading'"),
    ({}, {"style": "loud"}, "agents.a.plugin_settings.greeter.style"),
    ({"order": -1}, {}, "order must be >= 0, not -1"),
])
def test_greeter_bad_settings_stop_the_app(dsh_make_app: Callable[..., ScriptedApp], load: Any,
                                           table: dict[str, Any], agent: dict[str, Any],
                                           message: str) -> None:
    greeter = load("plugin-settings.md", "dsh_greeter.py")
    config = {"agents": {"a": {"plugins": ["greeter"],
                               "plugin_settings": {"greeter": agent}}},
              "plugins": {"greeter": table}}
    with pytest.raises(dsh.ConfigError, match=re.escape(message)):
        dsh_make_app(config, plugins={"greeter": greeter}).app.agent("a")
