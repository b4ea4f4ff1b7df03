"""dsh-otel (issue 28): OpenTelemetry GenAI traces into a real local backend.

The backend is Arize Phoenix (``arize-phoenix`` from PyPI, in a venv of its own: see
:func:`_phoenix`): ``phoenix serve`` is started on
127.0.0.1 with its own store in a temporary folder, takes OTLP/HTTP at ``/v1/traces`` and
answers ``GET /v1/projects/NAME/spans`` with every stored span, its parent and attributes.
The scenario (tests/scenario.py: a tool loop, a sub-agent, a compaction) runs in the real
``dsh`` in a subprocess with the installed plugin. Tests that need Phoenix skip with a reason
when it is not installed; the plugin's own tests need only dsh-otel.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests import scenario

pytest.importorskip("dsh_otel", reason="dsh-otel is not installed (pip install plugins/dsh-otel)")


def _phoenix() -> str | None:
    """``phoenix``: ``$DSH_TEST_PHOENIX``, else the repository's own ``.venv-phoenix`` (where
    the README's test command installs it, apart from the test venv: its dependencies and
    its pytest plugin stay out of every pytest run), else beside this Python, else on PATH."""
    given = os.environ.get("DSH_TEST_PHOENIX")
    if given:
        return given
    own = Path(__file__).resolve().parent.parent / ".venv-phoenix" / "bin" / "phoenix"
    if own.exists():
        return str(own)
    return shutil.which("phoenix", path=os.path.dirname(sys.executable)) or shutil.which(
        "phoenix")


PHOENIX = _phoenix()
needs_phoenix = pytest.mark.skipif(
    PHOENIX is None, reason="arize-phoenix is not installed (python -m venv .venv-phoenix && "
                            ".venv-phoenix/bin/pip install arize-phoenix): no local OTLP "
                            "backend to query")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as r:  # noqa: S310 - 127.0.0.1 only
        return json.loads(r.read())


class Phoenix:
    def __init__(self, folder: Path) -> None:
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "PHOENIX_"))}
        env.update(PHOENIX_WORKING_DIR=str(folder), PHOENIX_HOST="127.0.0.1",
                   PHOENIX_PORT=str(self.port), PHOENIX_GRPC_PORT=str(_free_port()),
                   PHOENIX_TELEMETRY_ENABLED="false")
        self.log = open(folder / "phoenix.log", "wb")  # noqa: SIM115 - closed in stop()
        assert PHOENIX is not None
        self.proc = subprocess.Popen([PHOENIX, "serve"], env=env, stdout=self.log,
                                     stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        self.folder = folder

    def wait(self, seconds: float = 300) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, (self.folder / "phoenix.log").read_text()[-3000:]
            try:
                urllib.request.urlopen(self.url + "/healthz", timeout=2).close()  # noqa: S310
                return
            except OSError:
                time.sleep(0.5)
        raise AssertionError("phoenix did not start in time: "
                             + (self.folder / "phoenix.log").read_text()[-3000:])

    def spans(self, project: str, expect: int, seconds: float = 180) -> list[dict[str, Any]]:
        """The project's spans once at least ``expect`` are stored (ingestion is batched)."""
        deadline = time.monotonic() + seconds
        found: list[dict[str, Any]] = []
        while time.monotonic() < deadline:
            try:
                found = _get(f"{self.url}/v1/projects/{project}/spans?limit=1000")["data"]
            except OSError:
                found = []
            if len(found) >= expect:
                time.sleep(1)  # anything more that was sent arrives too
                return list(_get(f"{self.url}/v1/projects/{project}/spans?limit=1000")["data"])
            time.sleep(0.5)
        raise AssertionError(f"{len(found)} spans in {project}, expected {expect}")

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
        self.log.close()


@pytest.fixture(scope="module")
def phoenix(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Phoenix]:
    server = Phoenix(tmp_path_factory.mktemp("phoenix"))
    try:
        server.wait()
        yield server
    finally:
        server.stop()


def _config(folder: Path, project: str, endpoint: str, **more: Any) -> None:
    scenario.make(folder, autoload=True, plugins={"otel": {
        # 60 s: a loaded machine's Phoenix took over 5 s to take a batch (the spans were
        # dropped, as a down collector's are); the down-collector tests set their own
        "enabled": True, "endpoint": endpoint, "timeout": 60,
        "resource": {"openinference.project.name": project}, **more}})


# Expected: lead turn (1) + 7 chat + 6 tool spans (5 read + ask_helper); helper turn (1) +
# 2 chat + 1 tool: 18 spans, one trace.
SPANS = 1 + len(scenario.LEAD_USAGE) + 6 + 1 + len(scenario.HELPER_USAGE) + 1


def check_trace(spans: list[dict[str, Any]]) -> None:
    assert len(spans) == SPANS, [s["name"] for s in spans]
    assert len({s["context"]["trace_id"] for s in spans}) == 1, "one trace"
    by_id = {s["context"]["span_id"]: s for s in spans}
    roots = [s for s in spans if s["parent_id"] is None]
    assert [r["name"] for r in roots] == ["invoke_agent lead"]
    root = roots[0]
    children = [s for s in spans if s["parent_id"] == root["context"]["span_id"]]
    chats = [s for s in children if s["name"].startswith("chat ")]
    tools = [s for s in children if s["name"].startswith("execute_tool ")]
    assert len(chats) == len(scenario.LEAD_USAGE) and len(tools) == 6
    assert sorted((c["attributes"]["gen_ai.usage.input_tokens"],
                   c["attributes"]["gen_ai.usage.output_tokens"]) for c in chats) \
        == sorted(scenario.LEAD_USAGE)
    assert all(c["attributes"]["gen_ai.operation.name"] == "chat" for c in chats)
    assert all(c["attributes"]["gen_ai.request.model"].startswith("scripted:") for c in chats)
    assert all(c["attributes"]["dsh.cost"] > 0 for c in chats)
    ask = [t for t in tools if t["name"] == "execute_tool ask_helper"]
    assert len(ask) == 1 and ask[0]["attributes"]["gen_ai.tool.call.id"]
    assert all(t["attributes"]["dsh.tool.status"] == "ok" for t in tools)
    # the sub-agent's turn is a child of the ask_helper tool span, its spans of that turn
    helper = [s for s in spans if s["name"] == "invoke_agent helper"]
    assert len(helper) == 1 and helper[0]["parent_id"] == ask[0]["context"]["span_id"]
    inner = [s for s in spans if s["parent_id"] == helper[0]["context"]["span_id"]]
    assert sorted(s["name"].split()[0] for s in inner) == ["chat", "chat", "execute_tool"]
    assert sorted((s["attributes"]["gen_ai.usage.input_tokens"],
                   s["attributes"]["gen_ai.usage.output_tokens"])
                  for s in inner if s["name"].startswith("chat")) == sorted(scenario.HELPER_USAGE)
    # totals on the turn spans; the compaction an event of the lead's turn
    a = root["attributes"]
    assert a["gen_ai.usage.input_tokens"] == sum(u[0] for u in scenario.LEAD_USAGE)
    assert a["gen_ai.usage.output_tokens"] == sum(u[1] for u in scenario.LEAD_USAGE)
    assert a["gen_ai.agent.name"] == "lead" and a["dsh.outcome"] == "completed"
    compactions = [e for e in root["events"] if e["name"] == "dsh.context.compacted"]
    assert compactions and compactions[0]["attributes"]["dsh.compaction.strategy"] == "mask"
    # content is opt-in: none by default
    assert not any(k.startswith(("gen_ai.input.messages", "gen_ai.output.messages",
                                 "gen_ai.tool.call.arguments", "gen_ai.tool.call.result"))
                   for s in spans for k in s["attributes"])
    assert all(by_id.get(s["parent_id"]) is not None for s in spans if s["parent_id"])


@needs_phoenix
def test_live_run_is_one_trace_in_phoenix(phoenix: Phoenix, tmp_path: Path) -> None:
    _config(tmp_path, "live", phoenix.url + "/v1/traces")
    scenario.run(tmp_path, DSH_LOAD_PLUGINS="otel")
    check_trace(phoenix.spans("live", SPANS))


@needs_phoenix
def test_export_rebuilds_the_same_trace_from_the_ledger(phoenix: Phoenix,
                                                       tmp_path: Path) -> None:
    scenario.make(tmp_path)  # the plugin not loaded: an unobserved run
    sid = scenario.run(tmp_path)
    _config(tmp_path, "rebuilt", phoenix.url + "/v1/traces")
    proc = scenario.dsh(tmp_path, "sessions", "export", "--otlp", sid, DSH_LOAD_PLUGINS="otel")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "" and f"sent {SPANS} spans" in proc.stderr
    check_trace(phoenix.spans("rebuilt", SPANS))


@needs_phoenix
def test_capture_content_is_opt_in_and_redacted(phoenix: Phoenix, tmp_path: Path) -> None:
    scenario.make(tmp_path, hostile="token sk-" + "a1" * 16 + " end")
    sid = scenario.run(tmp_path)
    _config(tmp_path, "content", "http://127.0.0.1:9/v1/traces", capture_content=True)
    proc = scenario.dsh(tmp_path, "otel", "export", sid, "--endpoint",  # --endpoint wins
                        phoenix.url + "/v1/traces", DSH_LOAD_PLUGINS="otel")
    assert proc.returncode == 0, proc.stderr
    spans = phoenix.spans("content", SPANS)
    text = json.dumps(spans)
    assert "gen_ai.tool.call.result" in text and "gen_ai.output.messages" in text
    assert "sk-a1a1" not in text and "[redacted]" in text


def test_down_collector_costs_one_warning_and_the_run_completes(tmp_path: Path) -> None:
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    _config(tmp_path, "down", f"http://127.0.0.1:{port}/v1/traces", timeout=1)
    proc = scenario.dsh(tmp_path, "run", "--json", "read everything", timeout=120,
                        DSH_LOAD_PLUGINS="otel")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["outcome"] == "completed"
    warnings = [line for line in proc.stderr.splitlines() if "otel" in line]
    assert len(warnings) == 1 and warnings[0].startswith("dsh: warning: otel: could not "
                                                         "export spans to http://127.0.0.1")
    sid = json.loads(proc.stdout)["session"]
    proc = scenario.dsh(tmp_path, "sessions", "show", sid)  # the ledger still loads
    assert proc.returncode == 0 and "all read" in proc.stdout


def test_export_to_a_down_collector_is_an_error(tmp_path: Path) -> None:
    scenario.make(tmp_path)
    sid = scenario.run(tmp_path)
    _config(tmp_path, "down", "http://127.0.0.1:9/v1/traces", timeout=1)
    proc = scenario.dsh(tmp_path, "otel", "export", sid, DSH_LOAD_PLUGINS="otel")
    assert proc.returncode == 1 and proc.stdout == ""
    assert "dsh: error: otel:" in proc.stderr and "not accepted by http://127.0.0.1:9" in \
        proc.stderr


def test_sessions_export_otlp_without_the_plugin_says_what_is_missing(tmp_path: Path) -> None:
    scenario.make(tmp_path)  # autoload off: dsh-otel not loaded
    sid = scenario.run(tmp_path)
    proc = scenario.dsh(tmp_path, "sessions", "export", "--otlp", sid)
    assert proc.returncode == 2 and proc.stdout == ""
    assert "--otlp: no plugin provides `dsh otel export` (pip install dsh-otel)" in proc.stderr


PROBE = """
import json, sys
from dsh.config.loader import load_config
from dsh.run.app import App
app = App(load_config(sys.argv[1]))
agent = app.agent()
result = app.run("read everything")
print(json.dumps({"observed": bool(agent.pm.hook.observe_event.get_hookimpls()),
                  "otel": sorted(m for m in sys.modules if m.startswith("opentelemetry")),
                  "plugins": [r.name for r in app.plugins], "outcome": result.outcome}))
"""


@pytest.mark.parametrize("enabled", [False, True])
def test_installed_but_disabled_builds_and_imports_nothing(tmp_path: Path,
                                                           enabled: bool) -> None:
    scenario.make(tmp_path, autoload=True,
                  plugins={"otel": {"enabled": enabled, "endpoint": "http://127.0.0.1:9",
                                        "timeout": 1}})
    proc = subprocess.run([sys.executable, "-c", PROBE, str(tmp_path / "dsh.toml")],
                          capture_output=True, text=True, timeout=120,
                          env=scenario.env(tmp_path, DSH_LOAD_PLUGINS="otel"),
                          stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stderr
    probe = json.loads(proc.stdout.splitlines()[-1])
    assert "otel" in probe["plugins"] and probe["outcome"] == "completed"
    assert probe["observed"] is enabled
    assert bool(probe["otel"]) is enabled


@pytest.mark.parametrize(("table", "needle"), [
    ({"enabled": "yes"}, "key 'enabled': expected true or false, got str"),
    ({"endpoint": "ftp://x"}, "key 'endpoint': expected an http:// or https:// URL"),
    ({"timeout": 0}, "key 'timeout': expected seconds in (0, 300]"),
    ({"headers": {"a": 1}}, "key 'headers': expected a table of strings"),
    ({"enabeld": True}, "unknown key 'enabeld'"),
])
def test_bad_settings_are_named(tmp_path: Path, table: dict[str, Any], needle: str) -> None:
    scenario.make(tmp_path, autoload=True, plugins={"otel": table})
    proc = scenario.dsh(tmp_path, "run", "hi", DSH_LOAD_PLUGINS="otel")
    assert proc.returncode != 0 and proc.stdout == ""
    assert needle in proc.stderr and "[plugins.otel]" in proc.stderr, proc.stderr


# -- hostile ledgers: any order, any text, any timestamp ---------------------------------------

def _in_memory() -> tuple[Any, Any]:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider.get_tracer("test"), exporter


def _event_strategy() -> Any:
    from hypothesis import strategies as st

    from dsh.core.messages import Usage
    from dsh.ledger import events as ev

    sid = st.sampled_from(["a", "b", "c"])
    text = st.text(max_size=20)
    ts = st.sampled_from(["", "2026-01-01T00:00:00Z", "garbage", "2026-01-01T00:00:01.5+02:00"])
    call = st.sampled_from(["c1", "c2", ""])
    return st.one_of(
        st.builds(ev.TurnStarted, session=sid, ts=ts, turn=st.integers(0, 3), agent=text,
                  model=st.none() | text, parent=st.none() | sid, parent_call=st.none() | call),
        st.builds(ev.StepStarted, session=sid, ts=ts, turn=st.just(1), step=st.integers(0, 3)),
        st.builds(ev.UserMessage, session=sid, ts=ts, text=text),
        st.builds(ev.AssistantMessage, session=sid, ts=ts, text=text, model=st.none() | text,
                  usage=st.builds(Usage, input_tokens=st.integers(0, 10**9),
                                  output_tokens=st.integers(0, 10**9))),
        st.builds(ev.ToolCalled, session=sid, ts=ts, call_id=call, name=text,
                  child_session=st.none() | sid),
        st.builds(ev.ToolReturned, session=sid, ts=ts, call_id=call, name=text, status=text,
                  output=text),
        st.builds(ev.ContextCompacted, session=sid, ts=ts, start=st.integers(0, 5),
                  end=st.integers(0, 5), strategy=text),
        st.builds(ev.TurnEnded, session=sid, ts=ts, turn=st.just(1), outcome=text, reason=text),
    )


def test_any_event_sequence_makes_spans_that_all_end() -> None:
    from dsh_otel.trace import Spans
    from hypothesis import given
    from hypothesis import settings
    from hypothesis import strategies as st

    @settings(max_examples=200, deadline=None)
    @given(st.lists(_event_strategy(), max_size=30), st.booleans())
    def check(events: list[Any], capture: bool) -> None:
        tracer, exporter = _in_memory()
        spans = Spans(tracer, price=lambda m: (1.0, 2.0), capture_content=capture)
        for e in events:
            spans.feed(e)
        spans.close()
        assert not spans.turns and not spans.tools
        finished = exporter.get_finished_spans()
        turns = sum(type(e).__name__ == "TurnStarted" for e in events)
        assert sum(s.name.startswith("invoke_agent") for s in finished) == turns
        ids = {s.context.span_id for s in finished}
        for s in finished:  # a parent is a span of the same trace that was exported too
            if s.parent is not None:
                assert s.parent.span_id in ids and s.parent.trace_id == s.context.trace_id
        assert all(s.end_time is not None for s in finished)

    check()


def test_rebuilding_a_ledger_that_names_itself_as_its_child_ends(tmp_path: Path) -> None:
    from dsh_otel.trace import Spans
    from dsh_otel.trace import feed_session

    from dsh.ledger import events as ev

    tracer, exporter = _in_memory()
    loop = [ev.TurnStarted(session="s", turn=1, agent="a"),
            ev.ToolCalled(session="s", call_id="c", name="ask_a", child_session="s"),
            ev.ToolReturned(session="s", call_id="c", name="ask_a"),
            ev.TurnEnded(session="s", turn=1, outcome="completed")]
    assert feed_session(Spans(tracer), lambda sid: loop, "s") == len(loop)
    assert len(exporter.get_finished_spans()) == 2


def test_a_tool_that_changed_files_gets_line_counts_never_the_diff() -> None:
    from dsh_otel.trace import Spans

    from dsh.ledger import events as ev
    from dsh.tools import changes

    tracer, exporter = _in_memory()
    secret_diff = changes.record("keys.txt", b"a\nb\n", b"a\nTOP-SECRET\nc\n")
    spans = Spans(tracer, capture_content=False)
    for e in (ev.TurnStarted(session="s", turn=1, agent="a"),
              ev.ToolCalled(session="s", call_id="c", name="edit_file"),
              ev.ToolReturned(session="s", call_id="c", name="edit_file", output="edited",
                              changes=(secret_diff,)),
              ev.TurnEnded(session="s", turn=1, outcome="completed")):
        spans.feed(e)
    spans.close()
    [tool] = [s for s in exporter.get_finished_spans() if s.name.startswith("execute_tool")]
    assert (tool.attributes["dsh.tool.files_changed"], tool.attributes["dsh.tool.lines_added"],
            tool.attributes["dsh.tool.lines_removed"]) == (1, 2, 1)
    assert not any("TOP-SECRET" in str(v) or "keys.txt" in str(v)
                   for v in tool.attributes.values())
