"""The pieces of ``dsh replay`` that stand in for the world (issue 37): the model, the tools
and the recorded compactions.

* :class:`ReplayApp` is an :class:`~dsh.run.app.App` — today's config, plugins and code —
  whose adapters are :class:`ReplayModel`: the session's own adapter (built without its key
  check, never asked to send) behind a model that hands every request it is given by dsh's
  transport to the driver, which compares it with the request recorded as sent and answers
  with the recorded response. Everything the agent reads of its adapter (default options,
  tool format, attachment types, effective id, window) is the real adapter's.
* Tools are not run: the agent's ``execute`` chain is replaced by :class:`ReplayExecute`,
  which returns each call's recorded ``tool/result`` (status, output, changes) by call id —
  also skipping ``pre_execute``/``post_execute``, whose implementations may have effects
  (approval questions, hook scripts); their effect is already in the recorded result.
* :class:`ReplayPlugin` answers ``compact_context`` with the compaction recorded before the
  request being made (``tryfirst``: plugin wrappers still see it), and drops context a
  plugin's ``pre_step`` adds again when the replay already gave it as recorded input.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Mapping
from typing import Any

from dsh.core.messages import ModelRequest
from dsh.core.messages import ModelResponse
from dsh.hookspecs import hookimpl
from dsh.llm.base import Model
from dsh.run.app import App
from dsh.tools.registry import ToolOutcome

PLUGIN = "dsh.replay"


class ReplayModel(Model):
    """Answers from the recording; everything else is the session's real adapter's."""

    def __init__(self, model_id: str, inner: Model | None, driver: Any) -> None:
        super().__init__(inner.name if inner is not None else model_id,
                         inner.settings if inner is not None else {})
        self.model_id = model_id
        self.inner = inner
        self.driver = driver
        if inner is not None:
            self.can_stream = inner.can_stream
            self.reserved_options = inner.reserved_options
            self.attachment_types = inner.attachment_types

    def __getattr__(self, name: str) -> Any:
        inner = self.__dict__.get("inner")
        if inner is None or name.startswith("__"):
            raise AttributeError(name)
        return getattr(inner, name)

    @property
    def effective_id(self) -> str | None:
        return self.inner.effective_id if self.inner is not None else None

    def default_options(self) -> Mapping[str, Any]:
        return self.inner.default_options() if self.inner is not None else {}

    def format_tool(self, tool: Any) -> Any:
        return self.inner.format_tool(tool) if self.inner is not None else super().format_tool(
            tool)

    def accepts_attachment(self, media_type: str) -> bool:
        if self.inner is None:
            return True  # the recording says the model took it
        return self.inner.accepts_attachment(media_type)

    def probe_context_window(self) -> None:
        return None  # never asks a server

    def body(self, request: ModelRequest) -> bytes | None:
        """The bytes the real adapter would send for ``request`` (not streamed), or None when
        it has no wire body (echo, scripted, a plugin's adapter)."""
        inner = self.inner
        build = getattr(type(inner), "build_body", None) if inner is not None else None
        if build is None:
            return None
        try:
            return json.dumps(build(inner, request, False), ensure_ascii=False).encode()
        except NotImplementedError:
            return None

    def complete(self, request: ModelRequest, on_text: Any = None) -> ModelResponse:
        return self.driver.answer(self, request)


class ReplayApp(App):
    """Today's app, whose adapters are :class:`ReplayModel` around the real ones."""

    def __init__(self, config: Any, driver: Any) -> None:
        super().__init__(config)
        self.driver = driver

    def build_model(self, model_id: str) -> Model:
        entry, prefix, name, settings = self.adapter_entry(model_id)
        inner = None
        if entry is not None:
            try:
                inner = entry.build(name, settings)  # no check(): no key is needed
            except Exception as exc:  # noqa: BLE001 - compared as plain requests then
                self.driver.note(f"model {model_id}: its adapter cannot be built here "
                                 f"({type(exc).__name__}: {exc}); requests are compared "
                                 "as dsh's own JSON")
        else:
            self.driver.note(f"model {model_id}: no adapter {prefix!r} is installed; "
                             "requests are compared as dsh's own JSON")
        return ReplayModel(model_id, inner, self.driver)


class ReplayExecute:
    """The agent's ``execute`` chain during a replay: the recorded result of each call."""

    def __init__(self, driver: Any, original: Any) -> None:
        self.driver = driver
        self.original = original
        self._lock = threading.Lock()

    def get_hookimpls(self) -> Any:
        return self.original.get_hookimpls()

    def __call__(self, call: Any) -> ToolOutcome:
        driver = self.driver
        with self._lock:
            driver.tool_effects(call.call.id)
        recorded = driver.plan.results.get(call.call.id)
        if recorded is None:
            return ToolOutcome("error", f"replay: no recorded result for tool call "
                                        f"{call.call.id} ({call.call.name})")
        return ToolOutcome(recorded.status, recorded.output, recorded.duration_ms,
                           recorded.changes)


class ReplayPlugin:
    """The hooks of a replay (registered in each agent's plugin manager as ``dsh.replay``)."""

    def __init__(self, driver: Any) -> None:
        self.driver = driver

    @hookimpl(tryfirst=True)
    def compact_context(self, request: Any) -> Any:
        event = self.driver.recorded_compaction()
        if event is None:
            return None
        from dsh.run.compaction import Compaction

        return Compaction(start=event.start, end=event.end, replacement=event.messages,
                          strategy=event.strategy, summary_session=event.summary_session)

    @hookimpl(trylast=True)
    def pre_step(self, step: Any) -> None:
        # The ledger records a message as pre_step left it (B4), not as it was typed: the
        # recorded text is the input, and what today's implementations make of it again is
        # put back to it (a rewrite applied twice is not a divergence; a rejection still is).
        text = self.driver.given_text
        self.driver.given_text = None
        if text is not None and step.has_input and step.source == "user":
            step.text = text
        given = self.driver.given_context
        if not given:
            return
        # the inbox's items come first; drop a plugin's addition that repeats one of them
        left = list(given)
        kept = []
        for i, item in enumerate(step.context):
            key = (item.text, item.source)
            if i >= len(given) and key in left:
                left.remove(key)
                continue
            kept.append(item)
        step.context[:] = kept
        self.driver.given_context = []


def install(agent: Any, driver: Any) -> None:
    """Put the replay's hooks and tool chain into ``agent``'s plugin manager (once)."""
    pm = agent.pm
    if pm.get_plugin(PLUGIN) is None:
        pm.register(ReplayPlugin(driver), name=PLUGIN)
    hook = pm.hook
    if not isinstance(hook.execute, ReplayExecute):
        setattr(hook, "execute", ReplayExecute(driver, hook.execute))  # noqa: B010
