"""The scripted model of :mod:`dsh.testing`: :class:`Script` and the adapter that answers from it.

A :class:`Script` holds the replies a test gives, in order, and records every request the model
received. The adapter class (``ScriptedTestModel``) is made on first use, since
:mod:`dsh.llm.base` imports the transport; it finds its script by the key the fixtures put in
the model's settings (:data:`_SCRIPTS`). :func:`register_models` is the dsh hook that offers
the model as :data:`MODEL`; :mod:`dsh.testing` re-exports it, since the fixtures' apps ``load``
that module.
"""

from __future__ import annotations

import itertools
import threading
import weakref
from collections.abc import Callable
from collections.abc import Iterable
from collections.abc import Mapping
from typing import TYPE_CHECKING
from typing import Any

from dsh.hookspecs import hookimpl

if TYPE_CHECKING:
    from dsh.core.messages import ModelRequest
    from dsh.llm.base import Model

#: The id (and adapter prefix) of the scripted model, which :mod:`dsh.testing` provides when it is
#: loaded as a dsh plugin: the default ``model`` of every app the fixtures build.
MODEL = "dsh-testing"


class Script:
    """The scripted model of one app: the replies it gives, in order, one per request, and
    every request it received.

    Add replies before the run that uses them (or between runs); each method returns the
    script, so calls chain: ``dsh_script.tool_call("add", a=1, b=2).text("3")``. A request
    with no reply left fails the turn (outcome ``error``) with a reason saying so.

    Replies are consumed in the order requests arrive, whatever session they belong to: a
    resumed session simply gets the next reply. Sub-agents running in parallel share the
    script, so their order is not fixed; give them replies that do not depend on it.
    """

    def __init__(self, replies: Iterable[Mapping[str, Any]] = ()) -> None:
        #: The replies not used yet, as the dicts the built-in ``scripted`` model reads
        #: (``text``, ``tool_calls``, ``usage``, ``stop_reason``, ``error``/``status``,
        #: ``delay``).
        self.replies: list[dict[str, Any]] = []
        #: Every request the model received, in order (:class:`dsh.core.messages.ModelRequest`,
        #: exactly as the adapter got it from dsh's transport).
        self.requests: list[ModelRequest] = []
        self._lock = threading.Lock()
        for reply in replies:
            self.add(reply)

    def add(self, reply: Mapping[str, Any]) -> Script:
        """Append a reply written as the built-in ``scripted`` model's JSON object."""
        from dsh.llm.builtin import _check_response

        self.replies.append(_check_response(dict(reply), len(self.replies), "dsh_script"))
        return self

    def text(self, text: str, **extra: Any) -> Script:
        """The model answers ``text`` (``extra``: ``usage={"input_tokens": …}``,
        ``stop_reason=…``, ``delay=seconds``)."""
        return self.add({"text": text, **extra})

    def tool_call(self, name: str, arguments: Mapping[str, Any] | None = None, /,
                  **kwargs: Any) -> Script:
        """The model calls one tool: ``tool_call("add", a=1, b=2)`` or, for argument names
        that are not identifiers, ``tool_call("add", {"a": 1})``."""
        return self.tool_calls((name, {**(arguments or {}), **kwargs}))

    def tool_calls(self, *calls: tuple[str, Mapping[str, Any]], text: str = "") -> Script:
        """The model calls several tools in one reply (they run concurrently):
        ``tool_calls(("a", {...}), ("b", {...}))``, with an optional ``text``."""
        return self.add({"text": text, "tool_calls": [
            {"name": name, "arguments": dict(args)} for name, args in calls]})

    def error(self, message: str, status: int | None = None) -> Script:
        """The provider fails: the request raises :class:`dsh.core.errors.ProviderError`
        (``scripted: MESSAGE``, with the HTTP ``status``)."""
        return self.add({"error": message, "status": status})

    def __len__(self) -> int:
        """How many replies are left."""
        return len(self.replies)

    def _take(self, request: ModelRequest) -> dict[str, Any]:
        import attrs

        with self._lock:
            # A view of the ledger's projection is stable, but a tuple reads better in a diff.
            self.requests.append(attrs.evolve(request, messages=tuple(request.messages)))
            if not self.replies:
                from dsh.core.errors import ProviderError

                raise ProviderError(
                    f"dsh.testing: the script has no reply left for request "
                    f"{len(self.requests)}: add one with dsh_script.text(...) or "
                    f".tool_call(...) before the run")
            return self.replies.pop(0)


_SCRIPTS: weakref.WeakValueDictionary[str, Script] = weakref.WeakValueDictionary()
_SCRIPT_IDS = itertools.count(1)
_MODEL_CLASS: type[Model] | None = None


def _model_class() -> type[Model]:
    """The adapter class, made on first use (dsh.llm.base imports the transport)."""
    global _MODEL_CLASS
    if _MODEL_CLASS is None:
        from dsh.core.messages import ModelResponse
        from dsh.core.messages import ToolCall
        from dsh.core.messages import Usage
        from dsh.llm.base import Model
        from dsh.llm.base import TextCallback
        from dsh.llm.builtin import _stream_words
        from dsh.llm.builtin import _wait

        class ScriptedTestModel(Model):
            """The model of the fixtures' apps: answers from a :class:`Script`."""

            def __init__(self, name: str, settings: Mapping[str, Any] | None = None) -> None:
                super().__init__(name, settings)
                key = str((settings or {}).get("script", ""))
                script = _SCRIPTS.get(key)
                if script is None:
                    from dsh.core.errors import ConfigError

                    raise ConfigError(f"model {MODEL!r} exists only in the apps of dsh.testing's "
                                      "fixtures (dsh_app, dsh_make_app)")
                self.script = script

            def complete(self, request: ModelRequest,
                         on_text: TextCallback | None = None) -> ModelResponse:
                reply = self.script._take(request)
                if reply.get("delay"):
                    _wait(float(reply["delay"]))
                if "error" in reply:
                    from dsh.core.errors import ProviderError

                    raise ProviderError(f"scripted: {reply['error']}", status=reply.get("status"))
                n = len(self.script.requests)
                text = reply.get("text", "")
                if request.stream:
                    _stream_words(text, on_text)
                # call_REPLY_CALL, both from 0: the ids `dsh run -m scripted:FILE` gives
                calls = tuple(ToolCall(id=c.get("id") or f"call_{n - 1}_{i}", name=c["name"],
                                       arguments=c.get("arguments") or {})
                              for i, c in enumerate(reply.get("tool_calls", ())))
                usage = reply.get("usage") or {}
                return ModelResponse(
                    text=text, tool_calls=calls,
                    usage=Usage(input_tokens=usage.get("input_tokens", 0),
                                output_tokens=usage.get("output_tokens", 0)),
                    stop_reason=reply.get("stop_reason", "tool_use" if calls else "end_turn"),
                    tool_call_source="native" if calls else None, model=MODEL)

        _MODEL_CLASS = ScriptedTestModel
    return _MODEL_CLASS


def _build_model(name: str, settings: Mapping[str, Any]) -> Model:
    return _model_class()(name, settings)


@hookimpl
def register_models(register: Callable[..., None]) -> None:
    """dsh hook: the scripted model, for the apps of the fixtures (they ``load`` this module)."""
    register(MODEL, _build_model, description="dsh.testing's scripted model (tests only)")
