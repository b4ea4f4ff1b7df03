"""Pins of the C3 transport (dsh/llm/transport.py): what each refusal says and whom it names,
which differences the check lists, what the by-value comparison counts as equal, and that the
normal path never compares by value (issue 9 §1 and §6; docs/testing.md, mutation testing).

tests/test_c3_transport.py proves the routes a hostile plugin takes are closed against a real
HTTP adapter; these tests pin the details a user or an attacker would notice, fast enough to
run for each of the module's mutants. The adapter here is a real :class:`~dsh.llm.base.Model`
subclass *defined while the tests run* (so the adapter guard installed by
``Model.__init_subclass__`` runs under test too); it records every request it is handed.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs
import pytest
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st

from dsh.config.loader import config_from_dict
from dsh.core.errors import BudgetExceeded
from dsh.core.errors import ConfigError
from dsh.core.errors import InvariantViolation
from dsh.core.messages import Attachment
from dsh.core.messages import FrozenDict
from dsh.core.messages import Message
from dsh.core.messages import ModelRequest
from dsh.core.messages import ModelResponse
from dsh.core.messages import Reasoning
from dsh.core.messages import ToolCall
from dsh.core.messages import ToolSpec
from dsh.core.messages import freeze
from dsh.core.messages import thaw
from dsh.hookspecs import hookimpl
from dsh.host.runcontext import Budget
from dsh.host.runcontext import Limits
from dsh.host.runcontext import RunContext
from dsh.host.runcontext import activate
from dsh.host.runcontext import context
from dsh.ledger.history import Projection
from dsh.llm import invariant
from dsh.llm import record
from dsh.llm import transport
from dsh.llm.base import Model
from dsh.run.app import App

PROTOCOL = "input, messages, model, prompt, stream, system, tools"
HEAD = "invariant C3 violated: the model request is not what the session ledger records: "


def tail(who: str = "Some plugin") -> str:
    return f". {who} changed it without writing it to the ledger; nothing was sent."


def weather(city: str) -> str:
    """Weather for a city."""
    return f"sunny in {city}"


def recorder_class() -> type[Model]:
    """A new adapter class (its ``complete`` guarded now, at test time): it answers from
    ``settings["script"]`` (a tool call to ``weather`` where the script says ``"call"``, else
    that text) and keeps every request it is handed in ``self.got``."""

    class Recorder(Model):
        can_stream = False

        def __init__(self, name: str, settings: Any = None) -> None:
            super().__init__(name, settings)
            self.got: list[ModelRequest] = []
            self.stores: list[Any] = []
            self.script = list((settings or {}).get("script", ()))

        def complete(self, request: ModelRequest, on_text: Any = None) -> ModelResponse:
            self.got.append(request)
            self.stores.append(transport.blobs())
            step = self.script.pop(0) if self.script else "ok"
            if step == "call":
                return ModelResponse(tool_calls=(ToolCall(id=f"c{len(self.got)}", name="weather",
                                                          arguments={"city": "Oslo"}),))
            return ModelResponse(text=step)

    return Recorder


#: The plugin registering the recorder adapter and the ``weather`` tool, compiled under a file
#: name of its own: a plugin that changes a request is named by its file, and the tests'
#: wrappers live in this one.
BASE_PLUGIN = """
from dsh.hookspecs import hookimpl

@hookimpl
def register_models(register):
    register("rec", CLS)

@hookimpl
def register_tools(register):
    register(weather)
"""


def make_app(folder: Path, plugin_module: Callable[..., str], *load: str,
             cls: type[Model] | None = None, script: tuple[str, ...] = (),
             **config: Any) -> App:
    ns: dict[str, Any] = {"CLS": cls or recorder_class(), "weather": weather}
    exec(compile(BASE_PLUGIN, "<the recorder plugin>", "exec"), ns)
    base = plugin_module(register_models=ns["register_models"],
                         register_tools=ns["register_tools"])
    cfg: dict[str, Any] = {
        "autoload": False, "sessions_dir": str(folder / "sessions"), "model": "rec:x",
        "models": {"rec:x": {"options": {"temperature": 0.5}, "script": list(script)}},
        "agents": {"default": {"system": "Be brief.", "options": {"seed": 7}}},
        "load": [base, *load]}
    cfg.update(config)
    return App(config_from_dict(cfg))


def wrapper(change: Callable[[Any], None]) -> Any:
    @hookimpl(wrapper=True)
    def request(call):  # type: ignore[no-untyped-def]
        change(call)
        return (yield)

    return request


def lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in path.read_text().splitlines()]


def same(text: str) -> str:
    """An equal string that is another object (so an identity test cannot shortcut)."""
    copy = "".join(list(text))
    assert copy == text and (copy is not text or len(text) < 2)
    return copy


# -- differences(): what the check lists ---------------------------------------------------


def base_request() -> ModelRequest:
    call = ToolCall(id="c1", name="weather", arguments={"city": "Oslo", "n": [1, 2.5, None]})
    messages = (
        Message(role="user", content="weather?",
                attachments=(Attachment(sha256="ab" * 32, media_type="image/png", size=3,
                                        name="a.png"),)),
        Message(role="assistant", content="", tool_calls=(call,),
                reasoning=(Reasoning(kind="thinking", provider="anthropic", text="hm",
                                     signature="sig"),)),
        Message(role="tool", content="sunny", tool_call_id="c1", name="weather",
                is_error=False),
    )
    tools = (ToolSpec(name="weather", description="Weather for a city.",
                      parameters={"type": "object", "properties": {"city": {"type": "string"}},
                                  "required": ["city"], "additionalProperties": False}),)
    return ModelRequest(model="rec:x", system="Be brief.", messages=messages, tools=tools,
                        options={"temperature": 0.5, "seed": 7, "stop": ["\n"], "x": None,
                                 "flag": True})


def deep_copy_request(req: ModelRequest) -> ModelRequest:
    """The same request, every value a new object (strings too)."""

    def copy(value: Any) -> Any:
        if type(value) is str:
            return same(value)
        if isinstance(value, dict):
            return {copy(k): copy(v) for k, v in value.items()}
        if isinstance(value, list | tuple):
            return tuple(copy(v) for v in value)
        if attrs.has(type(value)):
            return type(value)(**{f.name: copy(getattr(value, f.name))
                                  for f in attrs.fields(type(value))})
        return value

    return ModelRequest(model=copy(req.model), system=copy(req.system),
                        messages=copy(req.messages), tools=copy(req.tools),
                        options=copy(dict(req.options)))


def test_a_request_rebuilt_with_equal_values_has_no_differences():
    req = base_request()
    copy = deep_copy_request(req)
    assert copy.system is not req.system and copy.options is not req.options
    assert invariant.differences(copy, req) == []
    assert invariant.differences(req, copy) == []
    assert invariant.differences(req, req) == []


CHANGES: list[tuple[str, Callable[[ModelRequest], ModelRequest], list[str]]] = [
    ("system", lambda r: attrs.evolve(r, system="Be long."), ["system prompt differs"]),
    ("model", lambda r: attrs.evolve(r, model="rec:y"),
     ["model differs ('rec:y' vs 'rec:x' recorded)"]),
    ("tools", lambda r: attrs.evolve(r, tools=()), ["tool schemas differ"]),
    ("options", lambda r: attrs.evolve(r, options={**r.options, "seed": 8}),
     ["model options differ"]),
    ("a message more", lambda r: attrs.evolve(r, messages=(*r.messages, r.messages[0])),
     ["messages differ (4 sent, 3 in the ledger)"]),
    ("a message less", lambda r: attrs.evolve(r, messages=r.messages[:1]),
     ["messages differ (1 sent, 3 in the ledger)"]),
    ("everything", lambda r: attrs.evolve(r, model="m", system="s", tools=(), options={},
                                          messages=()),
     ["messages differ (0 sent, 3 in the ledger)", "system prompt differs",
      "tool schemas differ", "model differs ('m' vs 'rec:x' recorded)",
      "model options differ"]),
]


@pytest.mark.parametrize("change,expected", [c[1:] for c in CHANGES], ids=[c[0] for c in CHANGES])
def test_each_changed_field_is_listed_in_order(change, expected):
    req = base_request()
    assert invariant.differences(change(deep_copy_request(req)), req) == expected
    assert invariant.differences(change(req), req) == expected


def _field_changes() -> list[tuple[str, Callable[[ModelRequest], ModelRequest], str]]:
    """One change per field of every record type a request holds."""

    def other(value: Any) -> Any:
        if type(value) is bool:
            return not value
        if type(value) is str:
            return value + "!"
        if type(value) is int:
            return value + 1
        if value is None:
            return "set"
        if isinstance(value, tuple):
            return ()
        return {**value, "extra": 1}

    def in_message(i: int, f: str) -> Callable[[ModelRequest], ModelRequest]:
        def change(r: ModelRequest) -> ModelRequest:
            msgs = list(r.messages)
            msgs[i] = attrs.evolve(msgs[i], **{f: other(getattr(msgs[i], f))})
            return attrs.evolve(r, messages=tuple(msgs))
        return change

    def in_part(i: int, part: str, f: str) -> Callable[[ModelRequest], ModelRequest]:
        def change(r: ModelRequest) -> ModelRequest:
            msgs = list(r.messages)
            parts = getattr(msgs[i], part)
            changed = attrs.evolve(parts[0], **{f: other(getattr(parts[0], f))})
            msgs[i] = attrs.evolve(msgs[i], **{part: (changed,)})
            return attrs.evolve(r, messages=tuple(msgs))
        return change

    def in_tool(f: str) -> Callable[[ModelRequest], ModelRequest]:
        def change(r: ModelRequest) -> ModelRequest:
            return attrs.evolve(r, tools=(attrs.evolve(r.tools[0],
                                                       **{f: other(getattr(r.tools[0], f))}),))
        return change

    rows = []
    for f in attrs.fields(Message):
        rows.append((f"Message.{f.name}", in_message(1 if f.name in ("tool_calls",
                                                                     "reasoning") else
                                                     0 if f.name == "attachments" else 2,
                                                     f.name), "messages differ"))
    for cls, i, part in ((ToolCall, 1, "tool_calls"), (Reasoning, 1, "reasoning"),
                         (Attachment, 0, "attachments")):
        for f in attrs.fields(cls):
            rows.append((f"{cls.__name__}.{f.name}", in_part(i, part, f.name),
                         "messages differ"))
    for f in attrs.fields(ToolSpec):
        rows.append((f"ToolSpec.{f.name}", in_tool(f.name), "tool schemas differ"))
    return rows


FIELD_CHANGES = _field_changes()


@pytest.mark.parametrize("change,problem", [c[1:] for c in FIELD_CHANGES],
                         ids=[c[0] for c in FIELD_CHANGES])
def test_every_field_of_every_record_is_compared(change, problem):
    """Reasoning parts and attachments too: a wrapper changing what the model is told it
    thought, or which file it was shown, is a difference like any other."""
    req = base_request()
    changed = change(req)
    assert changed != req  # the table changes something
    problems = invariant.differences(changed, req)
    assert [p.split(" (")[0] for p in problems] == [problem]


class Str(str):
    pass


class Dict(dict):  # type: ignore[type-arg]
    pass


class SubMessage(Message):
    pass


def _hollow_message() -> Message:
    m = object.__new__(Message)  # no fields set: reading one raises AttributeError
    return m


def _cyclic() -> list[Any]:
    loop: list[Any] = []
    loop.append(loop)
    return loop


HOSTILE: list[tuple[str, str, Callable[[ModelRequest], Any], list[str]]] = [
    ("str subclass, equal value", "system", lambda r: Str(r.system), ["system prompt differs"]),
    ("dict subclass, equal value", "options", lambda r: Dict(r.options), ["model options differ"]),
    ("Message subclass, equal fields", "messages",
     lambda r: (*r.messages[:2], SubMessage(**attrs.asdict(r.messages[2], recurse=False))),
     ["messages differ (3 sent, 3 in the ledger)"]),
    ("a message with no fields", "messages", lambda r: (*r.messages[:2], _hollow_message()),
     ["messages differ (3 sent, 3 in the ledger)"]),
    ("a cycle", "options", lambda r: {**r.options, "stop": _cyclic()}, ["model options differ"]),
    ("no length", "messages", lambda r: iter(r.messages),
     ["messages differ (? sent, 3 in the ledger)"]),
    ("a set", "tools", lambda r: set(), ["tool schemas differ"]),
    ("model None", "model", lambda r: None, ["model differs (None vs 'rec:x' recorded)"]),
]


@pytest.mark.parametrize("name,field,value,expected", HOSTILE, ids=[h[0] for h in HOSTILE])
def test_values_a_request_cannot_hold_always_differ(name, field, value, expected):
    """A field planted past the converters (``object.__setattr__``) with a type a request
    never holds is a difference, whatever its ``__eq__`` says, and the check never raises."""
    req = base_request()
    hostile = deep_copy_request(req)
    object.__setattr__(hostile, field, value(hostile))
    assert invariant.differences(hostile, req) == expected


def test_a_request_of_another_type_is_named():
    req = base_request()
    assert invariant.differences(attrs.asdict(req), req) == [
        "the request is a dict, not a dsh ModelRequest"]

    class Sub(ModelRequest):
        pass

    sub = Sub(model=req.model, system=req.system, messages=req.messages, tools=req.tools,
              options=req.options)
    assert invariant.differences(sub, req) == ["the request is a Sub, not a dsh ModelRequest"]


JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-3, 3) | st.floats(allow_nan=False, width=32)
    | st.text(max_size=4),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner,
                                                                max_size=3),
    max_leaves=12)


def _leaves(value: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    if isinstance(value, dict):
        return [p for k, v in value.items() for p in _leaves(v, (*path, k))]
    if isinstance(value, list | tuple):
        return [p for i, v in enumerate(value) for p in _leaves(v, (*path, i))]
    return [path]


def _replace(value: Any, path: tuple[Any, ...], leaf: Any) -> Any:
    if not path:
        return leaf
    if isinstance(value, dict):
        return {k: _replace(v, path[1:], leaf) if k == path[0] else v for k, v in value.items()}
    return [_replace(v, path[1:], leaf) if i == path[0] else v for i, v in enumerate(value)]


@settings(max_examples=60, deadline=None)
@given(options=st.dictionaries(st.text(max_size=3), JSON, max_size=4), pick=st.integers(0, 99))
def test_plain_and_frozen_containers_compare_by_value(options, pick):
    """The by-value comparison sees through every container a request may hold (frozen or
    plain dicts, lists, tuples) to the scalars (None, bools, ints, floats, strings): equal
    values are equal, and changing any one leaf is a difference."""
    req = ModelRequest(model="m", options=options)
    assert type(req.options) is FrozenDict
    for plain in (thaw(req.options), freeze(options)):
        rebuilt = attrs.evolve(req)
        object.__setattr__(rebuilt, "options", plain)
        assert invariant.differences(rebuilt, req) == []
        assert invariant.differences(req, rebuilt) == []
    leaves = _leaves(options)
    if leaves:
        path = leaves[pick % len(leaves)]
        changed = _replace(thaw(req.options), path, ["changed"])
        other = attrs.evolve(req)
        object.__setattr__(other, "options", changed)
        assert invariant.differences(other, req) == ["model options differ"]
        object.__setattr__(other, "options", freeze(changed))
        assert invariant.differences(other, req) == ["model options differ"]


# -- check() and violation(): the public check and its message ------------------------------


def _projection(req: ModelRequest) -> Projection:
    proj = Projection()
    proj.model, proj.system, proj.tools, proj.options = (req.model, req.system, req.tools,
                                                         req.options)
    return proj


def test_check_against_a_projection_or_a_request():
    req = ModelRequest(model="rec:x", system="Be brief.", tools=base_request().tools,
                       options={"seed": 7})
    proj = _projection(req)
    invariant.check(deep_copy_request(req), proj)  # equal: no error
    invariant.check(deep_copy_request(req), req)
    invariant.check(object(), None)  # nothing to check against
    for expected in (proj, req):
        for change, problem in (({"system": "x"}, "system prompt differs"),
                                ({"options": {}}, "model options differ"),
                                ({"tools": ()}, "tool schemas differ"),
                                ({"model": "m"}, "model differs ('m' vs 'rec:x' recorded)"),
                                ({"messages": (Message(role="user", content="hi"),)},
                                 "messages differ (1 sent, 0 in the ledger)")):
            with pytest.raises(InvariantViolation) as err:
                invariant.check(attrs.evolve(req, **change), expected)
            assert str(err.value) == HEAD + problem + tail()
            assert err.value.plugin == ""


def test_a_violation_names_the_plugin_and_every_problem():
    exc = invariant.violation(["system prompt differs", "model options differ"], "probe")
    assert str(exc) == (HEAD + "system prompt differs; model options differ"
                        + tail("Plugin probe"))
    assert exc.plugin == "probe"
    anonymous = invariant.violation(["tool schemas differ"])
    assert str(anonymous) == HEAD + "tool schemas differ" + tail()
    assert anonymous.plugin == ""


# -- options: protocol keys ------------------------------------------------------------------


def test_check_option_keys_names_the_first_protocol_key_and_where():
    record.check_option_keys({"temperature": 1}, "anywhere")  # fine
    with pytest.raises(ConfigError) as err:
        record.check_option_keys({"tools": 1, "stream": True, "top_p": 1}, "[agents.x]")
    assert str(err.value) == (
        "[agents.x]: option 'stream' cannot be set through options: it is a field of the "
        f"request dsh builds from the session ledger (MISSION C3); protocol keys are {PROTOCOL}")


def test_adapter_defaults_and_reserved_keys_are_checked_and_named(tmp_path, plugin_module):
    base = recorder_class()

    class Defaults(base):  # type: ignore[valid-type,misc]
        def default_options(self) -> Any:
            return {"max_tokens": 10, "messages": []}

    with pytest.raises(ConfigError) as err:
        make_app(tmp_path, plugin_module, cls=Defaults).agent().options  # noqa: B018
    assert str(err.value).startswith(
        "model adapter Defaults (defaults): option 'messages' cannot be set through options")

    class Reserved(base):  # type: ignore[valid-type,misc]
        reserved_options = frozenset({"max_tokens"})

    app = make_app(tmp_path, plugin_module, cls=Reserved,
                   agents={"default": {"options": {"max_tokens": 5}}})
    with pytest.raises(ConfigError) as err:
        app.agent().options  # noqa: B018
    assert str(err.value).endswith(f"protocol keys are {', '.join(sorted(PROTOCOL.split(', ') + ['max_tokens']))}")  # noqa: E501

    class Merged(base):  # type: ignore[valid-type,misc]
        def default_options(self) -> Any:
            return {"max_tokens": 10, "temperature": 0.1}

    agent = make_app(tmp_path, plugin_module, cls=Merged).agent()
    # defaults, then model-level, then agent-level: later layers win
    assert dict(agent.options) == {"max_tokens": 10, "temperature": 0.5, "seed": 7}


# -- the adapter guard, on classes made at run time ----------------------------------------------


def test_an_adapter_made_now_is_guarded_and_sends_through_the_transport():
    cls = recorder_class()
    model = cls("x", {"script": ["one", "two"]})
    req = ModelRequest(model="rec:x", messages=(Message(role="user", content="hi"),))
    with pytest.raises(InvariantViolation) as err:
        model.complete(req)
    assert str(err.value) == (
        "model adapter Recorder: complete() was called outside dsh's transport, so nothing "
        "was sent (MISSION C3). Requests leave through dsh.llm.transport.send(), which checks "
        "them against the session ledger; a plugin that wants to change the request must "
        "write the change to the ledger, not call the adapter itself.")
    assert model.got == []
    assert transport.send(req, model=model).text == "one"
    assert model.got == [req]
    assert transport.guard(cls.complete) is cls.complete  # guarded once, not twice

    class Inherits(cls):  # type: ignore[valid-type,misc]
        pass

    class Overrides(cls):  # type: ignore[valid-type,misc]
        def complete(self, request: ModelRequest, on_text: Any = None) -> ModelResponse:
            answer = super().complete(request, on_text)  # its own super() call is let in
            return attrs.evolve(answer, text=answer.text.upper())

    for sub, text in ((Inherits, "inherited"), (Overrides, "OVERRIDDEN")):
        inner = sub("x", {"script": [text.lower()]})
        with pytest.raises(InvariantViolation, match="outside dsh's transport"):
            inner.complete(req)
        assert transport.send(req, model=inner).text == text
        assert len(inner.got) == 1


def test_an_adapter_whose_complete_is_replaced_later_sends_nothing():
    cls = recorder_class()
    model = cls("x")
    raw = cls.complete.__wrapped__  # the unguarded function, put back on the class
    cls.complete = raw  # type: ignore[method-assign]
    req = ModelRequest(model="rec:x")
    with pytest.raises(InvariantViolation) as err:
        transport.send(req, model=model)
    assert str(err.value) == (
        "model adapter Recorder: its complete() was replaced after the class was defined and "
        "no longer goes through dsh's transport; nothing was sent")
    assert model.got == []


# -- send() outside a run ------------------------------------------------------------------------


def test_standalone_sends_need_an_adapter_and_a_request():
    model = recorder_class()("x")
    req = ModelRequest(model="rec:x")
    with pytest.raises(InvariantViolation) as err:
        transport.send(req)
    assert str(err.value) == "transport.send outside a run needs the adapter (model=)"
    with pytest.raises(InvariantViolation) as err:
        transport.send(attrs.asdict(req), model=model)  # type: ignore[arg-type]
    assert str(err.value) == "transport.send: not a ModelRequest: dict"
    assert model.got == []


def test_a_hand_made_run_context_reserves_each_request():
    model = recorder_class()("x", {"script": ["one", "two"]})
    req = ModelRequest(model="rec:x")
    budget = Budget(limits=Limits(requests=1))
    with activate(RunContext(run_id="r", agent="a", ledger=None, budget=budget)):  # type: ignore[arg-type]
        assert transport.send(req, model=model).text == "one"
        with pytest.raises(BudgetExceeded) as err:
            transport.send(req, model=model)
    assert "model requests limit reached" in str(err.value)
    assert len(model.got) == 1 and budget.requests == 1
    free = Budget()
    with activate(RunContext(run_id="r", agent="a", ledger=None, budget=free)):  # type: ignore[arg-type]
        transport.send(req, model=model)
    assert free.requests == 1


def test_an_agents_adapter_is_refused_outside_its_runs(tmp_path, plugin_module):
    app = make_app(tmp_path, plugin_module)
    assert app.run("hi").outcome == "completed"
    adapter = app.agent().model
    with pytest.raises(InvariantViolation) as err:
        transport.send(ModelRequest(model="rec:x"), model=adapter)
    assert str(err.value) == (
        "model adapter Recorder belongs to an agent: its requests are sent by the agent's runs "
        "(MISSION C3), not from outside a run; nothing was sent")


class Unrecorded:
    """A ledger no turn was recorded in."""


def test_bind_needs_the_turn_recorded_first():
    with pytest.raises(InvariantViolation) as err:
        record.bind(None, recorder_class()("x"), Unrecorded(), None)  # type: ignore[arg-type]
    assert str(err.value) == "invariant C3: bind() before the turn was recorded"


# -- send() inside a run --------------------------------------------------------------------------


def test_what_the_adapter_gets_is_the_record(tmp_path, plugin_module):
    cls = recorder_class()
    app = make_app(tmp_path, plugin_module, cls=cls, script=("call", "done"))
    with app.session() as s:
        result = s.send("weather?")
        assert result.outcome == "completed", result.reason
        got, stores = s.agent.model.got, s.agent.model.stores
        assert stores == [s.ledger.blobs] * 2 and stores[0] is not None  # the session's
    assert transport.blobs() is None
    assert len(got) == 2
    start = lines(result.path)[0]
    for req in got:
        assert type(req) is ModelRequest
        assert req.model == start["model"] == "rec:x" and req.system == "Be brief."
        assert dict(req.options) == start["options"] == {"temperature": 0.5, "seed": 7}
        assert [t.name for t in req.tools] == ["weather"] and req.stream is False
    assert [m.role for m in got[1].messages] == ["user", "assistant", "tool"]


def test_the_normal_path_never_compares_by_value(tmp_path, plugin_module, monkeypatch):
    """O(1) per request: identities only, over turns, tool steps and a resumed session."""

    def never(*args: Any) -> Any:
        raise AssertionError("compared by value on the normal path")

    monkeypatch.setattr(transport, "_differences", never)  # where send looks it up
    monkeypatch.setattr(invariant, "_differences", never)
    monkeypatch.setattr(invariant, "_plain", never)
    app = make_app(tmp_path, plugin_module, script=("call", "a", "call", "b", "c"))
    with app.session() as s:
        assert s.send("one").outcome == "completed"
        assert s.send("two").outcome == "completed"
        sid, adapter = s.id, s.agent.model
        assert len(adapter.got) == 4 and adapter.tool_conversions == 1
    with app.session(session_id=sid) as again:
        resumed = again.agent.model
        resumed.script = ["c"]
        assert again.send("three").outcome == "completed"
    assert len(resumed.got) == (5 if resumed is adapter else 1)
    assert [m.content for m in resumed.got[-1].messages if m.role == "user"] == [
        "one", "two", "three"]


def _rebuilt(field: str) -> Callable[[Any], None]:
    def change(call: Any) -> None:
        r = call.request
        if field == "messages":
            value: Any = tuple(attrs.evolve(m, content=same(m.content)) for m in r.messages)
        elif field == "tools":
            value = tuple(ToolSpec(name=same(t.name), description=same(t.description),
                                   parameters=thaw(t.parameters)) for t in r.tools)
        elif field == "options":
            value = thaw(r.options)
        else:
            value = same(getattr(r, field))
        call.request = attrs.evolve(r, **{field: value})
    return change


@pytest.mark.parametrize("field", ["messages", "system", "tools", "model", "options"])
def test_a_request_rebuilt_with_equal_values_is_sent_as_recorded(tmp_path, plugin_module,
                                                                 field):
    app = make_app(tmp_path, plugin_module, plugin_module(request=wrapper(_rebuilt(field))),
                   script=("call", "done"))
    with app.session() as s:
        result = s.send("weather?")
        got = s.agent.model.got
    assert result.outcome == "completed", result.reason
    assert len(got) == 2
    assert got[0].system == "Be brief." and got[0].model == "rec:x"


def _smuggle(field: str) -> Callable[[Any], None]:
    def change(call: Any) -> None:
        r = call.request
        value = {"system": r.system + "!", "model": r.model + "!", "tools": (),
                 "options": {**r.options, "seed": 8},
                 "messages": (*r.messages, Message(role="user", content="psst"))}[field]
        call.request = attrs.evolve(r, **{field: value})
    return change


SMUGGLED = {"system": "system prompt differs", "model": "model differs ('rec:x!' vs 'rec:x' "
            "recorded)", "tools": "tool schemas differ", "options": "model options differ",
            "messages": "messages differ (2 sent, 1 in the ledger)"}


@pytest.mark.parametrize("field", sorted(SMUGGLED))
def test_a_changed_request_is_refused_naming_the_plugin_that_set_it(tmp_path, plugin_module,
                                                                    field):
    name = plugin_module(request=wrapper(_smuggle(field)))
    app = make_app(tmp_path, plugin_module, name)
    with app.session() as s:
        result = s.send("hi")
        got = s.agent.model.got
    assert result.outcome == "error"
    assert got == []
    assert isinstance(result.error, InvariantViolation) and result.error.plugin == name
    assert result.reason == HEAD + SMUGGLED[field] + tail(f"Plugin {name}")


def test_the_plugin_named_is_the_last_that_set_the_request(tmp_path, plugin_module):
    """Two plugins set ``call.request`` and one sets ``call.model`` (to the same adapter):
    the request's refusal names the last plugin that set the *request*."""

    @hookimpl(wrapper=True)
    def equal(call):  # type: ignore[no-untyped-def]
        call.request = attrs.evolve(call.request)
        return (yield)

    @hookimpl(wrapper=True)
    def smuggle(call):  # type: ignore[no-untyped-def]
        call.request = attrs.evolve(call.request, system="psst")
        return (yield)

    @hookimpl(wrapper=True)
    def same_model(call):  # type: ignore[no-untyped-def]
        call.model = call.model
        return (yield)

    outer, smuggler, model = (plugin_module(request=f) for f in (equal, smuggle, same_model))
    # the first in `load` is the innermost wrapper: the smuggler sets the request last
    result = make_app(tmp_path, plugin_module, smuggler, outer, model).run("hi")
    assert result.outcome == "error"
    assert result.error.plugin == smuggler  # type: ignore[union-attr]
    assert result.reason == HEAD + "system prompt differs" + tail(f"Plugin {smuggler}")


class Stand:
    """Stands in for the adapter (a proxy a plugin swaps onto ``call.model``)."""

    can_stream = False

    def __init__(self, real: Any) -> None:
        self.real = real

    def complete(self, request: Any, on_text: Any = None) -> Any:
        return transport.send(request, on_text, model=self.real)


def _swap_here(call):  # type: ignore[no-untyped-def]
    call.model = Stand(call.model)


def test_a_swapped_adapter_names_the_plugin_whose_hook_or_file_set_it(tmp_path,
                                                                      plugin_module):
    @hookimpl(wrapper=True)
    def request(call):  # type: ignore[no-untyped-def]
        call.model = Stand(call.model)  # set by the hook implementation itself
        return (yield)

    for impl in (request, wrapper(_swap_here)):  # ... or by a helper in the plugin's file
        name = plugin_module(request=impl)
        app = make_app(tmp_path, plugin_module, name)
        with app.session() as s:
            result = s.send("hi")
            got = s.agent.model.got
        assert result.outcome == "error" and got == []
        assert result.error.plugin == name  # type: ignore[union-attr]
        assert result.reason == (HEAD + "the adapter is not the recorded one (Stand object "
                                 "instead of the agent's Recorder)" + tail(f"Plugin {name}"))


def test_a_swap_that_leaves_no_trace_names_no_plugin(tmp_path, plugin_module):
    def hidden(call: Any) -> None:
        object.__setattr__(call, "_request", attrs.evolve(call.request, system="x"))

    name = plugin_module(request=wrapper(hidden))
    result = make_app(tmp_path, plugin_module, name).run("hi")
    assert result.outcome == "error"
    assert isinstance(result.error, InvariantViolation) and result.error.plugin == ""
    assert str(result.error) == HEAD + "system prompt differs" + tail()


def test_a_request_from_another_run_or_ledger_is_refused(tmp_path, plugin_module):
    seen: list[str] = []

    def elsewhere(call: Any) -> None:
        ctx = context()
        with activate(RunContext(run_id="other", agent="a", ledger=ctx.ledger)):
            try:
                transport.send(call.request, model=call.model)
            except InvariantViolation as exc:
                seen.append(str(exc))
        real = ctx.ledger
        ctx.ledger = object()  # type: ignore[assignment]
        try:
            transport.send(call.request, model=call.model)
        except InvariantViolation as exc:
            seen.append(str(exc))
        finally:
            ctx.ledger = real

    app = make_app(tmp_path, plugin_module, plugin_module(request=wrapper(elsewhere)))
    with app.session() as s:
        assert s.send("hi").outcome == "completed"
        assert len(s.agent.model.got) == 1
    assert seen == [
        "invariant C3: a request from outside the run its adapter was bound to; nothing was "
        "sent",
        "invariant C3: the run's ledger is not the one its turn was recorded in; nothing was "
        "sent"]


# -- record_turn: what turn/start records --------------------------------------------------------


def test_turn_start_records_only_what_changed_also_after_a_resume(tmp_path, plugin_module):
    app = make_app(tmp_path, plugin_module)
    with app.session() as s:
        assert s.send("one").outcome == "completed"
        assert s.send("two").outcome == "completed"
        sid = s.id
    again = make_app(tmp_path, plugin_module)  # a new process would load it like this
    with again.session(session_id=sid) as s:
        assert s.send("three").outcome == "completed"
        s.agent.options = {"seed": 9}
        assert s.send("four").outcome == "completed"
        path = s.ledger.path
    starts = [e for e in lines(path) if e["type"] == "turn/start"]
    assert len(starts) == 4
    assert (starts[0]["model"], starts[0]["system"], starts[0]["options"]) == (
        "rec:x", "Be brief.", {"temperature": 0.5, "seed": 7})
    assert [t["name"] for t in starts[0]["tools"]] == ["weather"]
    for start in starts[1:3]:  # unchanged: nothing recorded again, even after loading
        assert [start.get(k) for k in ("model", "system", "tools", "options")] == [None] * 4
    assert starts[3].get("options") == {"seed": 9}
    assert [starts[3].get(k) for k in ("model", "system", "tools")] == [None] * 3
    assert [dict(r.options) for r in s.agent.model.got] == [{"seed": 7, "temperature": 0.5},
                                                            {"seed": 9}]


def test_a_recorded_schema_is_sent_from_a_private_copy_made_once(tmp_path, plugin_module):
    """What leaves is a copy of the recorded tool schemas and options taken when they were
    recorded (not the objects a plugin can reach), taken once per change, not per turn."""
    app = make_app(tmp_path, plugin_module)
    with app.session() as s:
        for text in ("one", "two", "three"):
            assert s.send(text).outcome == "completed"
        got = s.agent.model.got
        tools, options = s.agent.tool_specs, s.agent.options
    assert got[0].tools == tuple(tools) and got[0].tools[0] is not tools[0]
    assert got[0].options == options and got[0].options is not options
    assert got[1].tools is got[0].tools is got[2].tools
    assert got[1].options is got[0].options is got[2].options


# -- more of what the comparison and the attribution must get right ------------------------------


def test_an_unhashable_key_after_rebuilding_is_a_difference_not_a_crash():
    req = base_request()
    hostile = deep_copy_request(req)
    object.__setattr__(hostile, "options", {**req.options, ("a", "b"): 1})  # a tuple key
    assert invariant.differences(hostile, req) == ["model options differ"]


def test_a_changed_system_prompt_is_found_without_walking_the_history(monkeypatch):
    """Only the fields that are not the recorded objects are compared by value: the history
    (a view of the same list) is not walked, whatever its length."""
    proj = Projection()
    proj.system = "Be brief."
    seen: list[type] = []
    real = invariant._plain

    def spy(value: Any) -> Any:
        seen.append(type(value))
        return real(value)

    monkeypatch.setattr(invariant, "_plain", spy)
    view = proj.view()
    req = ModelRequest(model=proj.model, system="Be long.", messages=proj.view(),
                       tools=proj.tools, options=proj.options)
    assert req.messages is not view and req.messages.same_as(view)
    expected = ModelRequest(model=proj.model, system=proj.system, messages=view,
                            tools=proj.tools, options=proj.options)
    assert invariant.differences(req, expected) == ["system prompt differs"]
    assert seen == [str, str]


#: A helper library (no plugin lives in its file) that changes the request for its caller.
LIBRARY = """
def tweak(call, system):
    call.request = attrs.evolve(call.request, system=system)
"""


@pytest.mark.parametrize("where", ["library", "dsh"])
def test_a_change_made_by_code_outside_every_plugin_names_none(tmp_path, plugin_module, where):
    """Helper code that is no plugin's (a library, or dsh's own module that also holds a
    built-in plugin's hooks) is not blamed: the refusal names no plugin."""
    import dsh.llm.builtin

    filename = {"library": "<a helper library>", "dsh": dsh.llm.builtin.__file__}[where]
    ns: dict[str, Any] = {"attrs": attrs}
    exec(compile(LIBRARY, filename, "exec"), ns)
    name = plugin_module(request=wrapper(lambda call: ns["tweak"](call, "psst")))
    app = make_app(tmp_path, plugin_module, name)
    with app.session() as s:
        result = s.send("hi")
        assert s.agent.model.got == []
    assert result.outcome == "error"
    assert isinstance(result.error, InvariantViolation) and result.error.plugin == ""
    assert str(result.error) == HEAD + "system prompt differs" + tail()


def test_callbacks_and_the_blob_store_reach_the_adapter_and_nothing_else():
    """``on_reasoning`` goes to adapters that take it (by name or ``**kwargs``), never to
    older ones; both callbacks run outside the adapter's dispatch (calling the adapter from
    one is refused); the blob store passed to a standalone send is the adapter's for the
    call only."""
    req = ModelRequest(model="m", messages=(Message(role="user", content="hi"),))
    got: list[Any] = []

    class Thinks(Model):
        def complete(self, request: ModelRequest, on_text: Any = None,
                     on_reasoning: Any = None) -> ModelResponse:
            got.append(transport.blobs())
            if on_reasoning is not None:
                on_reasoning("hm")
            if on_text is not None:
                on_text(self.name)
            return ModelResponse(text=request.messages[-1].content + self.name)

    class TakesAny(Model):
        def complete(self, request: ModelRequest, on_text: Any = None,
                     **more: Any) -> ModelResponse:
            more["on_reasoning"]("any")
            return ModelResponse(text="any")

    class Older(Model):
        def complete(self, request: ModelRequest, on_text: Any = None) -> ModelResponse:
            got.append(transport.blobs())
            on_text(request.messages[-1].content)
            return ModelResponse(text="older")

    class Unreadable(Model):
        def complete(self, request: ModelRequest, on_text: Any = None) -> ModelResponse:
            return ModelResponse(text="unreadable")

        complete.__signature__ = 0  # type: ignore[attr-defined]  # inspect cannot read it

    def reenter(log: list[str], model: Model) -> Callable[[str], None]:
        def deliver(delta: str) -> None:
            log.append(delta)
            with pytest.raises(InvariantViolation, match="outside dsh's transport"):
                model.complete(req)
        return deliver

    store = object()
    text: list[str] = []
    thoughts: list[str] = []
    thinks = Thinks("!")
    answer = transport.send(req, reenter(text, thinks), model=thinks,
                            on_reasoning=reenter(thoughts, thinks), blobs=store)
    assert (answer.text, text, thoughts, got) == ("hi!", ["!"], ["hm"], [store])
    assert transport.blobs() is None
    assert transport.send(req, model=Thinks("?")).text == "hi?"  # no callbacks: none called
    assert thoughts == ["hm"] and got[-1] is None
    anything: list[str] = []
    assert transport.send(req, model=TakesAny("x"), on_reasoning=anything.append).text == "any"
    assert anything == ["any"]
    assert transport.send(req, text.append, model=Older("x"),
                          on_reasoning=anything.append).text == "older"
    assert anything == ["any"] and got[-1] is None and text[-1] == "hi"
    assert transport.send(req, model=Unreadable("x"),
                          on_reasoning=anything.append).text == "unreadable"


def test_reasoning_deltas_reach_an_adapter_inside_a_run(tmp_path, plugin_module):
    base = recorder_class()

    class Thinking(base):  # type: ignore[valid-type,misc]
        can_stream = True

        def complete(self, request: ModelRequest, on_text: Any = None,
                     on_reasoning: Any = None) -> ModelResponse:
            if on_reasoning is not None:
                on_reasoning("thinking")
            return super().complete(request, on_text)

    thoughts: list[str] = []
    app = make_app(tmp_path, plugin_module, cls=Thinking)
    with app.session() as s:
        assert s.send("hi", on_text=lambda d: None,
                      on_reasoning=thoughts.append).outcome == "completed"
        assert s.send("again", on_text=lambda d: None).outcome == "completed"
    assert thoughts == ["thinking"]


def test_a_view_of_another_history_is_compared_by_value():
    one, other = Projection(), Projection()
    from dsh.ledger.events import UserMessage

    for proj, text in ((one, "hi"), (other, "psst")):
        event = UserMessage(text=text)
        object.__setattr__(event, "seq", 1)
        proj.apply(event)
    expected = ModelRequest(model="", messages=one.view())
    assert invariant.differences(ModelRequest(model="", messages=one.view()), expected) == []
    assert invariant.differences(ModelRequest(model="", messages=other.view()), expected) == [
        "messages differ (1 sent, 1 in the ledger)"]
    with pytest.raises(InvariantViolation, match="messages differ"):
        invariant.check(ModelRequest(model="", messages=other.view()), one)
    invariant.check(ModelRequest(model="", messages=(Message(role="user", content="hi"),)), one)
