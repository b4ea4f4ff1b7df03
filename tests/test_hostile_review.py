"""A hostile review of the wave-2 features (issues 11 and 17): each test reproduces a defect
found by attacking a feature, and pins the class of inputs it belongs to (docs/security.md).

Each was checked to fail on the code before its fix.
"""

from __future__ import annotations

import http.server
import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import example
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st

from dsh.core.errors import OutputSchemaError
from dsh.core.errors import UsageError

DSH = [sys.executable, "-m", "dsh"]


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    config = tmp_path / "dsh.toml"
    config.write_text("autoload = false\n")
    e = {k: v for k, v in os.environ.items()
         if k not in ("NO_COLOR", "DSH_LOAD_PLUGINS") and not k.endswith("_API_KEY")}
    e.update(DSH_CONFIG=str(config), XDG_DATA_HOME=str(tmp_path / "data"))
    return e


def dsh(env: dict[str, str], *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*DSH, *args], env=env, input="", capture_output=True, text=True,
                          timeout=timeout)


class _Counting(http.server.BaseHTTPRequestHandler):
    hits: list[str] = []

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        type(self).hits.append(self.path)
        body = b'{"type": "integer"}'
        self.send_response(200)
        self.send_header("Content-Type", "application/schema+json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def schema_host() -> Iterator[tuple[str, list[str]]]:
    """A loopback server that would serve a schema to anyone who fetched one (it counts)."""
    hits: list[str] = []
    handler = type("Handler", (_Counting,), {"hits": hits})
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{srv.server_port}", hits
    finally:
        srv.shutdown()
        srv.server_close()


# -- structured output: a schema's $ref never fetches anything ------------------------------------
#
# Defect: jsonschema's default registry fetches an http(s) `$ref` with urllib (with only a
# DeprecationWarning), so `--schema` with `{"$ref": "http://169.254.169.254/..."}` made dsh
# send a GET there at validation time, and the answer was judged by a remote document the
# ledger does not hold. A `file:` ref was a traceback.

_REF_FORMS = ["{host}/s.json", "{host}/s.json#/x", "file:///etc/hostname", "other.json",
              "//127.0.0.1:1/x", "urn:example:x", "{host}/"]


def _with_ref_at(ref: str, depth: int) -> dict[str, Any]:
    node: dict[str, Any] = {"$ref": ref}
    for i in range(depth):
        node = {"type": "object", "properties": {f"p{i}": node}} if i % 2 else \
            {"type": "array", "items": node}
    return {"type": "object", "properties": {"a": node}}


@settings(max_examples=60, deadline=None)
@given(form=st.sampled_from(_REF_FORMS), depth=st.integers(0, 6),
       key=st.sampled_from(["$ref", "$dynamicRef"]))
def test_schema_refs_outside_the_schema_are_refused_and_never_fetched(
        schema_host: tuple[str, list[str]], form: str, depth: int, key: str) -> None:
    from dsh.llm.schema import load
    from dsh.llm.schema import problems

    host, hits = schema_host
    ref = form.format(host=host)
    schema = json.loads(json.dumps(_with_ref_at(ref, depth)).replace('"$ref"', f'"{key}"'))
    with pytest.raises(UsageError, match="points outside the schema"):
        load(schema)
    with pytest.raises(UsageError, match="points outside the schema"):
        load(json.dumps(schema))
    # A schema that never went through load() (a hand-edited ledger's options): validating
    # with it fails clearly, and still fetches nothing.
    answer = json.dumps({"a": "x"})
    try:
        problems(answer, schema)
    except OutputSchemaError as exc:
        assert "dsh never fetches" in str(exc)
    assert hits == []


def test_schema_refs_inside_the_schema_still_work() -> None:
    from dsh.llm.schema import load
    from dsh.llm.schema import problems

    schema = load({"type": "object", "$defs": {"n": {"type": "integer"}},
                   "properties": {"a": {"$ref": "#/$defs/n"}}, "required": ["a"]})
    assert problems('{"a": 1}', schema) == ({"a": 1}, [])
    assert problems('{"a": "x"}', schema)[1] == ["$.a: 'x' is not of type 'integer'"]


# -- structured output: deep and huge documents are answers the schema refuses, never a crash ----
#
# Defect: an answer nested a few thousand levels deep raised RecursionError out of the
# built-in schema plugin (`plugin dsh.llm.schema raised in hook turn_stopping: RecursionError`),
# so the model was never told and the run failed blaming dsh; a deeply nested schema file
# was a traceback at `--schema`.


@settings(max_examples=40, deadline=None)
@given(depth=st.integers(1, 30_000), opener=st.sampled_from(["[", '{"a":']))
def test_any_answer_depth_is_a_verdict_never_an_exception(depth: int, opener: str) -> None:
    from dsh.llm.schema import MAX_ANSWER_DEPTH
    from dsh.llm.schema import problems

    closer = "]" if opener == "[" else "}"
    text = opener * depth + ("1" if opener != "[" else "") + closer * depth
    schema = {"type": "object", "$defs": {"n": {"anyOf": [{"type": "integer"},
                                                          {"type": "array",
                                                           "items": {"$ref": "#/$defs/n"}},
                                                          {"type": "object",
                                                           "additionalProperties":
                                                               {"$ref": "#/$defs/n"}}]}},
              "additionalProperties": {"$ref": "#/$defs/n"}}
    value, found = problems(text, schema)
    if depth > MAX_ANSWER_DEPTH:
        assert value is None and found and "nested" in found[0]
    else:
        assert (value is None) == bool(found)


def test_a_deeply_nested_answer_is_sent_back_not_a_plugin_crash(env: dict[str, str],
                                                                tmp_path: Path) -> None:
    deep = "[" * 50_000 + "]" * 50_000
    script = tmp_path / "script.json"
    script.write_text(json.dumps({"responses": [{"text": deep}, {"text": deep}]}))
    out = dsh(env, "run", "-m", f"scripted:{script}", "--schema", "name", "who?")
    assert out.returncode == 1, out.stderr
    assert "RecursionError" not in out.stderr and "raised in hook" not in out.stderr
    assert "does not match the output schema" in out.stderr
    assert "nested more than" in out.stderr
    assert out.stdout == ""


@pytest.mark.parametrize("make, said", [
    (lambda p: p.write_text('{"type": "object", "properties": {"a": '
                            + '{"items": ' * 5000 + "{}" + "}" * 5000 + "}}"),
     "nested too deeply"),
    (lambda p: p.write_text('{"type": "object", "properties": {"a": '
                            + '{"items": ' * 80 + "{}" + "}" * 80 + "}}"),
     "nested more than 64 levels"),
    (lambda p: p.write_text('{"type": "object", "description": "' + "x" * (1 << 20) + '"}'),
     "larger than 1048576 bytes"),
    (lambda p: os.mkfifo(p), "not a regular file"),
])
def test_hostile_schema_files_are_one_clear_error(env: dict[str, str], tmp_path: Path,
                                                  make: Any, said: str) -> None:
    path = tmp_path / "schema.json"
    make(path)
    out = dsh(env, "run", "-m", "echo", "--schema", str(path), "hi", timeout=30)
    assert out.returncode == 2, out.stderr
    assert said in out.stderr and "Traceback" not in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1


def test_a_deep_output_schema_mapping_is_a_usage_error() -> None:
    from dsh.llm.schema import load

    node: dict[str, Any] = {}
    for _ in range(5000):
        node = {"items": node}
    with pytest.raises(UsageError, match="nested too deeply"):
        load({"type": "object", "properties": {"a": node}})


# -- model data: a lookup costs O(the id's length), whatever the id ------------------------------
#
# Defect: `lookup` tried every prefix of every `:`-suffix of the id (and sliced each), so an
# id of 10,000 characters like `a:a:a:…` took 54 s (O(n^3)) inside `window`/`price_for`,
# which a run calls for its model. Now a prefix longer than the longest name in the data file
# is never tried and the forms are made in one pass.


def _reference_lookup(model_id: str) -> Any:
    """The lookup as it was (the semantics to keep), for ids short enough to afford it."""
    from dsh.core import modeldata

    name = model_id.strip().lower()
    forms = [name] + [name[i + 1:] for i, ch in enumerate(name) if ch == ":"]
    out: list[str] = []
    for form in forms:
        out.append(form)
        vendor, sep, rest = form.partition("/")
        if sep and rest and vendor:
            out.append(rest)
    names = modeldata.table()
    best: Any = None
    for form in (f for f in out if f):
        for length in range(len(form), 0, -1):
            facts = names.get(form[:length])
            if facts is not None:
                if best is None or length > best[0]:
                    best = (length, facts)
                break
    return best[1] if best else None


def _known_names() -> list[str]:
    from dsh.core import modeldata

    return sorted(modeldata.table())


@settings(max_examples=300, deadline=None)
@given(parts=st.lists(st.one_of(st.sampled_from(_known_names()),
                                st.sampled_from([":", "/", " ", "-", "x", "ollama", "openai",
                                                 "anthropic", "a:b", "//", "::"]),
                                st.text(max_size=6)), max_size=8))
def test_model_lookup_keeps_its_meaning_for_any_id(parts: list[str]) -> None:
    from dsh.core import modeldata

    model_id = "".join(parts)
    assert modeldata.lookup(model_id) == _reference_lookup(model_id)


@pytest.mark.parametrize("model_id", ["a:" * 50_000, "a:/" * 40_000, "x/" * 50_000,
                                      "openai:" + "gpt-4o" * 20_000, ":" * 100_000])
def test_model_lookup_of_a_huge_adversarial_id_is_fast(model_id: str) -> None:
    """Was 54 s for 'a:' * 5_000 (O(n^3)). Counted, not timed (no timing assertion in a unit
    test): lookup tries each form of the id cut to the longest known name, and an id has at
    most two forms per ':', so its work is linear in the id's length."""
    from dsh.core import modeldata

    longest = modeldata._longest()
    forms = modeldata.candidates(model_id, longest)
    assert len(forms) <= 2 * (model_id.count(":") + 1)
    assert all(len(f) <= longest for f in forms)
    modeldata.lookup(model_id)  # and the real calls return
    modeldata.price_for(model_id)


# -- dsh install: a PKG is never a pip option ----------------------------------------------------
#
# Defect: `dsh install -- --index-url=URL NAME` (or a script's `dsh install "$NAME"` with a
# name starting with '-') passed the option through to pip, which then fetched from URL.


@pytest.mark.parametrize("args", [
    ["install", "--", "--index-url={host}/simple", "dsh-no-such-plugin"],
    ["install", "--", "--extra-index-url={host}/simple", "dsh-no-such-plugin"],
    ["install", "--", "-i", "{host}/simple", "dsh-no-such-plugin"],
    ["install", "dsh-no-such-plugin", "--", "-r{host}/req.txt"],
    ["uninstall", "--yes", "--", "-r", "/etc/hostname"],
])
def test_install_refuses_a_package_that_pip_would_read_as_an_option(
        env: dict[str, str], schema_host: tuple[str, list[str]], args: list[str]) -> None:
    host, hits = schema_host
    before = len(hits)
    env = {**env, "PIP_DRY_RUN": "1", "PIP_NO_INPUT": "1", "PIP_RETRIES": "0",
           "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    out = dsh(env, *[a.format(host=host) for a in args], timeout=120)
    assert out.returncode == 2, out.stderr
    assert "starts with '-'" in out.stderr
    assert len(hits) == before  # pip was never run: nothing fetched from the given index


# -- a stream shows the user exactly what is recorded --------------------------------------------
#
# Defect: the openai-responses adapter printed the `output_text` deltas while it recorded the
# text of `response.completed`'s output, so a server could show the user one answer and put
# another in the ledger (and in the next request). The Anthropic adapter recorded text a
# `content_block_start` carried without ever showing it, and recorded blocks in index order
# while showing them in arrival order. Now such a stream is a malformed-stream error and
# nothing is recorded.

_TEXT = st.text(st.characters(exclude_categories=["Cs"]), max_size=8)


@pytest.fixture(scope="module")
def stream_server() -> Iterator[Any]:
    from tests.servers import scripted_server

    yield from scripted_server()


def _shown_or_refused(model: Any, req: Any) -> tuple[Any, str]:
    from dsh.core.errors import ProviderError
    from dsh.llm.transport import send

    seen: list[str] = []
    try:
        response = send(req, on_text=seen.append, model=model)
    except ProviderError as exc:
        assert "differs from the text it streamed" in str(exc), str(exc)
        return None, "".join(seen)
    return response, "".join(seen)


@settings(max_examples=60, deadline=None)
@given(deltas=st.lists(_TEXT, max_size=5), final=st.one_of(st.none(), _TEXT),
       refusal=st.booleans())
@example(deltas=[""], final="0", refusal=False)  # an empty delta shows nothing
@example(deltas=["a", "b"], final="ab", refusal=False)
@example(deltas=["SHOWN"], final="RECORDED", refusal=False)
def test_responses_stream_records_only_what_it_showed(stream_server: Any,
                                                      deltas: list[str], final: str | None,
                                                      refusal: bool) -> None:
    from dsh.core.messages import Message
    from dsh.core.messages import ModelRequest
    from dsh.llm.responses import ResponsesModel
    from tests.servers import Reply
    from tests.servers import sse

    text = "".join(deltas) if final is None else final  # None: an honest server
    kind = "refusal" if refusal else "output_text"
    item = {"type": "message", "id": "msg_1", "role": "assistant", "status": "completed",
            "content": [{"type": kind, kind if refusal else "text": text}]}
    chunks = [sse({"type": "response.output_item.added", "output_index": 0,
                   "item": {**item, "content": []}})]
    chunks += [sse({"type": f"response.{kind}.delta", "output_index": 0, "content_index": 0,
                    "delta": d}) for d in deltas]
    chunks += [sse({"type": "response.output_item.done", "output_index": 0, "item": item}),
               sse({"type": "response.completed",
                    "response": {"id": "resp_1", "status": "completed", "model": "o4-mini",
                                 "output": [item], "usage": {"input_tokens": 1,
                                                             "output_tokens": 1}}})]
    stream_server.script(Reply(chunks=chunks, headers={"content-type": "text/event-stream"}))
    model = ResponsesModel("o4-mini", {"base_url": stream_server.url + "/v1", "retries": 0,
                                        "api_key": "sk-test-review-0000000000"})
    req = ModelRequest(model="openai-responses:o4-mini",
                       messages=[Message(role="user", content="hi")], stream=True,
                       options={"store": False})
    response, shown = _shown_or_refused(model, req)
    if response is not None:
        assert response.text == shown or not "".join(deltas)
    if final is None or final == "".join(deltas) or not "".join(deltas):
        assert response is not None  # an honest stream is never refused


@settings(max_examples=60, deadline=None)
@given(blocks=st.lists(st.tuples(_TEXT, st.lists(_TEXT, max_size=3)), min_size=1, max_size=3),
       reverse=st.booleans())
def test_anthropic_stream_records_only_what_it_showed(stream_server: Any,
                                                      blocks: list[tuple[str, list[str]]],
                                                      reverse: bool) -> None:
    from dsh.core.messages import Message
    from dsh.core.messages import ModelRequest
    from dsh.llm.anthropic import AnthropicModel
    from tests.servers import Reply
    from tests.servers import sse

    chunks = [sse({"type": "message_start", "message": {
        "id": "msg_1", "type": "message", "role": "assistant", "model": "claude-sonnet-4-5",
        "content": [], "stop_reason": None, "usage": {"input_tokens": 1, "output_tokens": 1}}})]
    order = list(range(len(blocks)))[::-1] if reverse else list(range(len(blocks)))
    for i in order:  # a hostile server may start a block with text, or send them out of order
        start, deltas = blocks[i]
        chunks.append(sse({"type": "content_block_start", "index": i,
                           "content_block": {"type": "text", "text": start}}))
        chunks += [sse({"type": "content_block_delta", "index": i,
                        "delta": {"type": "text_delta", "text": d}}) for d in deltas]
        chunks.append(sse({"type": "content_block_stop", "index": i}))
    chunks += [sse({"type": "message_delta", "delta": {"stop_reason": "end_turn"},
                    "usage": {"output_tokens": 2}}), sse({"type": "message_stop"})]
    stream_server.script(Reply(chunks=chunks, headers={"content-type": "text/event-stream"}))
    model = AnthropicModel("claude-sonnet-4-5", {"base_url": stream_server.url, "retries": 0,
                                                  "api_key": "sk-ant-test-review-000000000"})
    req = ModelRequest(model="anthropic:claude-sonnet-4-5",
                       messages=[Message(role="user", content="hi")], stream=True)
    response, shown = _shown_or_refused(model, req)
    if response is not None:
        assert response.text == shown
    honest = all(not s for s, _ in blocks) and (not reverse or sum(
        1 for _, d in blocks if "".join(d)) <= 1)
    if honest:
        assert response is not None


# -- the agent handle: settings are read-only and never shared between apps ---------------------
#
# Defect: `AgentHandle.all_plugin_settings` was the config's own `plugins` dict, so two Apps
# made from one config shared it: a plugin changing its settings in place in one app changed
# them in the other (issue 11: two apps keep separate state), and `settings`, documented as
# frozen, was a plain dict a hook could change under every later hook of the agent.

_MUTATIONS = [
    ("settings", lambda h: h.settings.__setitem__("model", "other")),
    ("settings.options", lambda h: h.settings["options"].__setitem__("temperature", 9)),
    ("plugin settings list", lambda h: h.all_plugin_settings["x"]["a"].append(2)),
    ("plugin settings table", lambda h: h.all_plugin_settings["x"]["t"].update(k=2)),
    ("plugin_settings() nested", lambda h: h.plugin_settings("x")["a"].append(3)),
    ("plugin_settings() table", lambda h: h.plugin_settings("x")["t"].pop("k")),
]


@pytest.mark.parametrize("what, mutate", _MUTATIONS, ids=[m[0] for m in _MUTATIONS])
def test_agent_handle_settings_cannot_be_changed_in_place_nor_leak_across_apps(
        what: str, mutate: Any) -> None:
    from dsh.config.loader import config_from_dict
    from dsh.run.app import App

    cfg = config_from_dict({"autoload": False,
                            "plugins": {"x": {"a": [1], "t": {"k": 1}}},
                            "agents": {"default": {"model": "echo",
                                                   "options": {"temperature": 1}}}})
    one, two = App(cfg), App(cfg)
    handle = one.agent().handle
    with pytest.raises(TypeError):
        mutate(handle)
    for h in (handle, two.agent().handle):
        assert h.plugin_settings("x") == {"a": [1], "t": {"k": 1}}
        assert h.settings["options"] == {"temperature": 1}
        assert h.settings["model"] == "echo"
    assert cfg.plugins == {"x": {"a": [1], "t": {"k": 1}}}
    # the top level of plugin_settings() is the caller's own copy, as before
    mine: Any = handle.plugin_settings("x")
    mine["extra"] = 1
    assert "extra" not in handle.plugin_settings("x")


# -- plugin events: naming a plugin by its distribution costs nothing per event -----------------
#
# Defect: for a plugin loaded by module (`load = ["dsh_hooks"]`), or any name that is not a
# loaded plugin, every `record_event` scanned every installed distribution
# (`importlib.metadata.packages_distributions()`, ~80 ms here): dsh-hooks, which writes under
# its distribution name `dsh-hooks`, paid that per event. Now once per app.


def test_plugin_event_names_are_checked_without_rescanning_installed_packages(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.metadata

    from dsh.config.loader import config_from_dict
    from dsh.ledger.plugin_events import PluginEventError
    from dsh.run.app import App

    real = importlib.metadata.packages_distributions
    scans: list[int] = []

    def counting() -> Any:
        scans.append(1)
        return real()

    monkeypatch.setattr(importlib.metadata, "packages_distributions", counting)
    app = App(config_from_dict({"autoload": False, "sessions_dir": str(tmp_path / "s"),
                                "model": "echo", "load": ["dsh_hooks"]}))
    with app.session() as s:
        for i in range(50):
            s.record_event("dsh-hooks", "seen", {"i": i})  # the distribution's name
            s.record_event("dsh_hooks", "seen", {"i": i})  # the registered name
            with pytest.raises(PluginEventError, match="no plugin 'nope'"):
                s.record_event("nope", "x")
        assert len(s.plugin_events("dsh-hooks")) == 50
    assert len(scans) <= 1
    other = App(config_from_dict({"autoload": False, "sessions_dir": str(tmp_path / "t"),
                                  "model": "echo"}))  # dsh_hooks not loaded here
    with other.session() as s, pytest.raises(PluginEventError, match="no plugin 'dsh-hooks'"):
        s.record_event("dsh-hooks", "seen")


# -- NaN and infinities from a model never enter the ledger, a request or stdout -----------------
#
# Defect: Python's json accepts `NaN`, `Infinity` and `1e999` (inf). A model writing tool-call
# arguments `{"n": NaN}` had them recorded as `NaN` (not JSON: `sessions export`, `--events`
# and every other reader choke on it) and sent back on the next request (an Anthropic
# `input` object with NaN is not JSON either); `--schema` printed `{"n": NaN}` on stdout as
# "the JSON document"; a provider response holding them was taken as is.

_JSON_FLOATS = st.floats(allow_nan=True, allow_infinity=True)
_JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**53), 2**53) | _JSON_FLOATS | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner,
                                                                max_size=3),
    max_leaves=12)


@settings(max_examples=200, deadline=None)
@given(args=st.dictionaries(st.text(max_size=4), _JSON_VALUES, max_size=4),
       as_text=st.booleans())
def test_tool_arguments_are_always_strict_json(args: dict[str, Any], as_text: bool) -> None:
    from dsh.llm.base import parse_tool_arguments

    raw: Any = json.dumps(args) if as_text else args
    parsed = parse_tool_arguments(raw)
    json.dumps(parsed, allow_nan=False)  # what is recorded and sent back is JSON
    from dsh.core.sanitize import has_nonfinite

    if not has_nonfinite(args):
        assert parsed == args or parsed == json.loads(json.dumps(args))


@pytest.mark.parametrize("text", ['{"n": NaN}', '{"n": Infinity}', '{"n": -Infinity}',
                                  '{"n": 1e999}', '```json\n{"n": NaN}\n```'])
def test_schema_answer_with_nan_is_not_a_json_document(env: dict[str, str], tmp_path: Path,
                                                       text: str) -> None:
    script = tmp_path / "script.json"
    script.write_text(json.dumps({"responses": [{"text": text}, {"text": text}]}))
    out = dsh(env, "run", "-m", f"scripted:{script}", "--schema", "n float", "n?")
    assert out.returncode == 1, out.stderr
    assert out.stdout == ""
    assert "not a JSON document" in out.stderr


@pytest.mark.parametrize("body", [
    b'{"id": "x", "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"},'
    b' "finish_reason": "stop"}], "usage": {"prompt_tokens": NaN, "completion_tokens": 1}}',
    b'{"id": "x", "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi",'
    b' "x": 1e999}, "finish_reason": "stop"}]}',
])
def test_a_provider_reply_with_nan_is_malformed(stream_server: Any, body: bytes) -> None:
    from dsh.core.errors import ProviderError
    from dsh.core.messages import Message
    from dsh.core.messages import ModelRequest
    from dsh.llm.openai import OpenAIModel
    from dsh.llm.transport import send
    from tests.servers import Reply

    stream_server.script(Reply(body=body, headers={"content-type": "application/json"}))
    model = OpenAIModel("gpt-4o-mini", {"base_url": stream_server.url + "/v1", "retries": 0,
                                        "api_key": "sk-test-review-0000000000"})
    req = ModelRequest(model="openai:gpt-4o-mini", messages=[Message(role="user", content="hi")])
    with pytest.raises(ProviderError, match="malformed response"):
        send(req, model=model)


@settings(max_examples=150, deadline=None)
@given(args=st.dictionaries(st.text(max_size=4), _JSON_VALUES, min_size=1, max_size=3),
       form=st.sampled_from(["<tool_call>{call}</tool_call>", "{call}", "[{call}]",
                             "```json\n{call}\n```", "<|python_tag|>{call}"]),
       openai_style=st.booleans())
def test_tool_calls_rescued_from_text_have_strict_json_arguments(
        args: dict[str, Any], form: str, openai_style: bool) -> None:
    from dsh.core.messages import ModelResponse
    from dsh.core.messages import thaw
    from dsh.llm.builtin import rescue

    arguments: Any = json.dumps(args) if openai_style else args
    call = json.dumps({"name": "calc", "arguments": arguments})
    response = rescue(ModelResponse(text=form.replace("{call}", call)), ["calc"])
    for c in response.tool_calls:
        json.dumps(thaw(c.arguments), allow_nan=False)  # recorded, and sent back: JSON


# -- a provider response is bounded in size -------------------------------------------------------
#
# Defect: nothing bounded what dsh read of a provider response: one endless SSE line (no
# newline ever) grew the parser's buffer, an endless stream of text deltas grew the answer, a
# huge JSON body or error body was read whole — a runaway or hostile server could fill memory.
# Now MAX_RESPONSE_BYTES (256 MiB) ends it with a non-retried error, nothing recorded (the
# tests lower it to keep them fast).


@pytest.mark.parametrize("shape", ["endless line", "endless deltas", "json body", "error body"])
def test_a_provider_response_over_the_cap_is_an_error(stream_server: Any,
                                                      monkeypatch: pytest.MonkeyPatch,
                                                      shape: str) -> None:
    from dsh.core.errors import ProviderError
    from dsh.core.messages import Message
    from dsh.core.messages import ModelRequest
    from dsh.llm.http import client
    from dsh.llm.openai import OpenAIModel
    from dsh.llm.transport import send
    from tests.servers import Reply
    from tests.servers import sse

    monkeypatch.setattr(client, "MAX_RESPONSE_BYTES", 256 * 1024)
    kb = b"x" * 1024
    if shape == "endless line":
        reply = Reply(chunks=[b"data: "] + [kb] * 400,
                      headers={"content-type": "text/event-stream"})
    elif shape == "endless deltas":
        delta = sse({"choices": [{"index": 0, "delta": {"content": "y" * 1000}}]})
        reply = Reply(chunks=[delta] * 400, headers={"content-type": "text/event-stream"})
    elif shape == "json body":
        reply = Reply(body=b'{"pad": "' + kb * 400 + b'"}',
                      headers={"content-type": "application/json"})
    else:
        reply = Reply(status=400, body=b'{"error": {"message": "' + kb * 400 + b'"}}',
                      headers={"content-type": "application/json"})
    stream_server.script(reply)
    model = OpenAIModel("gpt-4o-mini", {"base_url": stream_server.url + "/v1", "retries": 0,
                                        "api_key": "sk-test-review-0000000000"})
    req = ModelRequest(model="openai:gpt-4o-mini", messages=[Message(role="user", content="hi")],
                       stream=shape.startswith("endless"))
    with pytest.raises(ProviderError, match="larger than 262144 bytes") as caught:
        send(req, on_text=lambda _: None, model=model)
    assert not caught.value.retryable


# -- attachments: a redirect to an internal address (what holds, pinned) --------------------------
#
# Decided, not changed: dsh follows a URL attachment's redirects to any http(s) address,
# loopback and link-local (cloud metadata) included — the user named the URL. What keeps
# that from leaking an internal service's answer to the provider is the content check: only
# bytes with an image or PDF signature are attached, and the refusal quotes none of them.


def test_a_redirect_to_an_internal_text_endpoint_is_refused_without_quoting_it(
        stream_server: Any) -> None:
    from dsh.llm.attachments import AttachmentError
    from dsh.llm.attachments import fetch
    from tests.servers import Reply

    secret = b'{"AccessKeyId": "ASIAEXAMPLEEXAMPLE", "SecretAccessKey": "wJalrXUtnFEMI"}'
    stream_server.script(
        Reply(status=302, headers={"location": f"{stream_server.url}/latest/meta-data/iam"}),
        Reply(body=secret, headers={"content-type": "image/png"}))  # a lying content type
    with pytest.raises(AttachmentError) as caught:
        fetch(f"{stream_server.url}/photo.png?token=abc")
    message = str(caught.value)
    assert "not a PNG" in message
    assert "ASIA" not in message and "wJal" not in message and "token" not in message


# -- plugin events: a hand-made deep payload is a clear error, not a traceback ------------------
#
# Defect: a ledger line `x/P/N` whose `data` nests a few hundred levels (valid JSON, which the
# reader takes) made `sessions show`, `sessions export`, `--continue` — every command that
# reads the session — end in a RecursionError traceback (freezing the payload recursed).
# Now a payload deeper than MAX_READ_DEPTH is an invalid line naming the file and line, and
# any event too deep to build is "nested too deeply to read" (dsh/ledger/store.py).


def _session_with(env: dict[str, str], extra: dict[str, Any], last: bool = False) -> Path:
    out = dsh(env, "run", "-m", "echo", "hello")
    assert out.returncode == 0, out.stderr
    path = next(Path(env["DSH_CONFIG"]).parent.rglob("*.jsonl"))
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    head = {k: lines[0][k] for k in ("v", "ts", "session")}
    at = len(lines) if last else 3
    lines.insert(at, {**head, **extra})
    for i, line in enumerate(lines):
        line["seq"] = i
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return path


def test_a_deep_plugin_event_payload_is_one_clear_error_everywhere(env: dict[str, str]) -> None:
    deep = json.loads("[" * 700 + "]" * 700)
    path = _session_with(env, {"type": "x/evil/deep", "plugin": "evil", "name": "deep",
                               "data": {"d": deep}})
    for args in (["sessions", "show", "latest"], ["sessions", "show", "latest", "--json"],
                 ["sessions", "export", "latest", "--format", "jsonl"],
                 ["run", "-m", "echo", "--continue", "again"]):
        out = dsh(env, *args)
        assert out.returncode == 1, (args, out.stderr[-300:])
        assert "Traceback" not in out.stderr
        assert out.stderr.strip().splitlines() == [
            f"dsh: error: {path}:4: invalid plugin event: 'data' of 'x/evil/deep' nests more "
            "than 128 levels deep"]


@settings(max_examples=40, deadline=None)
@given(depth=st.integers(1, 900))
def test_plugin_event_payload_depth_on_read_is_loaded_or_refused(depth: int) -> None:
    from dsh.core.errors import LedgerError
    from dsh.ledger.plugin_events import MAX_READ_DEPTH
    from dsh.ledger.scan import parse_line
    from dsh.ledger.serialize import default_codec

    data = {"d": json.loads("[" * (depth - 1) + "]" * (depth - 1))} if depth > 1 else {"d": 1}
    line = json.dumps({"v": 1, "seq": 0, "ts": "t", "session": "s", "type": "x/p/n",
                       "plugin": "p", "name": "n", "data": data}).encode()
    try:
        event = parse_line(line, default_codec(), "f.jsonl:1", 0)
    except LedgerError as exc:
        assert depth > MAX_READ_DEPTH, str(exc)
        assert "f.jsonl:1" in str(exc)
    else:
        assert depth <= MAX_READ_DEPTH
        assert json.loads(json.dumps(getattr(event, "data"))) == data  # noqa: B009


# -- stored keys: a key that can never be sent is refused when it is set --------------------------
#
# Defect: `dsh keys set` stored a key holding a control character (an escape sequence, NUL)
# or non-ASCII text — pasted with the terminal's junk — and said "stored"; it failed only at
# the first request. And `dsh keys list` printed every name of a hand-edited keys file, escape
# sequences included, where the keyring store shows only valid names.


@pytest.mark.parametrize("key", ["sk-live-\x1b[2J\x1b]52;c;QUFB\x07abcdef",
                                 "sk-live-abc\x00def", "sk-live-ab\u00e9cdef", "sk-\x7fabcdef"])
def test_keys_set_refuses_a_key_no_header_can_carry(env: dict[str, str], tmp_path: Path,
                                                    key: str) -> None:
    env = {**env, "XDG_CONFIG_HOME": str(tmp_path / "cfg"), "DSH_KEYS_BACKEND": "file"}
    out = subprocess.run([*DSH, "keys", "set", "openai"], env=env, input=key,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2, out.stderr
    assert "not stored" in out.stderr and key not in out.stderr and "sk-live" not in out.stderr
    listed = subprocess.run([*DSH, "keys", "list"], env=env, capture_output=True, text=True,
                            timeout=60)
    assert listed.stdout == ""


def test_keys_list_shows_only_valid_names(env: dict[str, str], tmp_path: Path) -> None:
    env = {**env, "XDG_CONFIG_HOME": str(tmp_path / "cfg"), "DSH_KEYS_BACKEND": "file"}
    out = subprocess.run([*DSH, "keys", "set", "good"], env=env, input="sk-good-123456789",
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    path = tmp_path / "cfg" / "dsh" / "keys" / "keys.json"
    data = json.loads(path.read_text())
    data["keys"]["\x1b]52;c;QUFB\x07evil"] = "sk-evil-123456789"
    data["keys"]["../x"] = "sk-other-123456789"
    path.write_text(json.dumps(data))
    listed = subprocess.run([*DSH, "keys", "list"], env=env, capture_output=True, text=True,
                            timeout=60)
    assert listed.returncode == 0, listed.stderr
    assert listed.stdout == "good\n"


# -- usage a server reports cannot give budget back ------------------------------------------------
#
# Defect: the Anthropic adapter took `input_tokens`, `output_tokens` and the cache counts as
# given, and the OpenAI adapter `prompt_tokens`/`completion_tokens`: a server reporting
# `output_tokens: -1000000` lowered the run's token and cost counters, so token and cost
# limits could be talked past. Now every count from a server is a non-negative int (else 0),
# and the budget itself never adds a negative count, whatever adapter (a plugin's) made it.

_BAD_COUNTS = [-1_000_000, -1, "12", 1.5, None, True, [3], {"a": 1}]


@pytest.mark.parametrize("bad", _BAD_COUNTS, ids=repr)
@pytest.mark.parametrize("adapter", ["anthropic-json", "anthropic-stream", "openai-json",
                                     "openai-stream"])
def test_reported_usage_is_never_negative(stream_server: Any, adapter: str, bad: Any) -> None:
    from dsh.core.messages import Message
    from dsh.core.messages import ModelRequest
    from dsh.llm.anthropic import AnthropicModel
    from dsh.llm.openai import OpenAIModel
    from dsh.llm.transport import send
    from tests.servers import Reply
    from tests.servers import sse

    stream = adapter.endswith("stream")
    if adapter.startswith("anthropic"):
        usage = {"input_tokens": bad, "output_tokens": bad, "cache_read_input_tokens": bad,
                 "cache_creation_input_tokens": bad}
        if stream:
            start = {"id": "m", "type": "message", "role": "assistant", "model": "c",
                     "content": [], "usage": usage}
            chunks = [sse({"type": "message_start", "message": start}),
                      sse({"type": "content_block_start", "index": 0,
                           "content_block": {"type": "text", "text": ""}}),
                      sse({"type": "content_block_delta", "index": 0,
                           "delta": {"type": "text_delta", "text": "hi"}}),
                      sse({"type": "message_delta", "delta": {"stop_reason": "end_turn"},
                           "usage": {"output_tokens": bad}}),
                      sse({"type": "message_stop"})]
            reply = Reply(chunks=chunks, headers={"content-type": "text/event-stream"})
        else:
            reply = Reply(body={"id": "m", "type": "message", "role": "assistant", "model": "c",
                                "content": [{"type": "text", "text": "hi"}],
                                "stop_reason": "end_turn", "usage": usage},
                          headers={"content-type": "application/json"})
        model: Any = AnthropicModel("c", {"base_url": stream_server.url, "retries": 0,
                                          "api_key": "sk-ant-test-review-000000000"})
        req = ModelRequest(model="anthropic:c", messages=[Message(role="user", content="q")],
                           stream=stream)
    else:
        usage = {"prompt_tokens": bad, "completion_tokens": bad, "total_tokens": bad}
        if stream:
            chunks = [sse({"choices": [{"index": 0, "delta": {"content": "hi"}}]}),
                      sse({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}],
                           "usage": usage}), b"data: [DONE]\n\n"]
            reply = Reply(chunks=chunks, headers={"content-type": "text/event-stream"})
        else:
            reply = Reply(body={"id": "x", "model": "g", "choices": [{
                "index": 0, "message": {"role": "assistant", "content": "hi"},
                "finish_reason": "stop"}], "usage": usage},
                headers={"content-type": "application/json"})
        model = OpenAIModel("g", {"base_url": stream_server.url + "/v1", "retries": 0,
                                  "api_key": "sk-test-review-0000000000"})
        req = ModelRequest(model="openai:g", messages=[Message(role="user", content="q")],
                           stream=stream)
    stream_server.script(reply)
    from dsh.core.errors import ProviderError

    try:
        response = send(req, on_text=lambda _: None, model=model)
    except ProviderError as exc:  # a count the adapter cannot read at all: malformed, fine
        assert "malformed" in str(exc)
        return
    u = response.usage
    assert min(u.input_tokens, u.output_tokens, u.cache_read_tokens, u.cache_write_tokens) >= 0
    assert all(type(v) is int for v in (u.input_tokens, u.output_tokens))


def test_the_budget_never_adds_a_negative_count(make_app: Any, plugin_module: Any) -> None:
    from dsh.core.messages import ModelResponse
    from dsh.core.messages import Usage
    from dsh.hookspecs import hookimpl
    from dsh.llm.base import Model

    class Liar(Model):  # a plugin adapter that passes on what its server claimed
        def complete(self, request: Any, on_text: Any = None) -> ModelResponse:
            return ModelResponse(text="ok", usage=Usage(input_tokens=-5, output_tokens=-10**6,
                                                        cache_read_tokens=-3))

    @hookimpl
    def register_models(register: Any) -> None:
        register("liar", Liar)

    app = make_app(model="liar:x", load=[plugin_module(register_models=register_models)])
    result = app.run("hi")
    assert result.outcome == "completed", result.reason
    assert (result.usage.input_tokens, result.usage.output_tokens) == (0, 0)
