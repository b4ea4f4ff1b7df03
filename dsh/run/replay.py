"""``dsh replay``: prove that every request of a session is rebuilt from its ledger (issue 37,
MISSION C3, C6).

:func:`replay` re-drives a stored session turn by turn, **under today's code, config and
plugins**, in a scratch session that is never saved (an in-memory ledger): the recorded
inputs go in (each turn's message with its attachments and injected context, messages steered
in, events written between turns — :mod:`dsh.run.replay_plan`), the model is replaced by one
that answers each request with the recorded ``assistant/message``, tools by their recorded
results, and compactions are applied where they were recorded
(:mod:`dsh.run.replay_model`). Every request today's loop hands to dsh's transport — the
sealed request, the bytes that would leave — is compared with the request recorded as sent at
that point (the projection of every line before that answer), as the JSON body the session's
adapter would send, else as dsh's own JSON of the request. The first difference stops the
replay and is reported (:class:`Divergence`: which request, turn and step, which field, a
unified diff). No model is called, no tool runs, nothing is written to the session store.

:func:`rerun` (``dsh replay ID --model M``) is the other use: the session's user inputs sent
again, for real, to another model, into a new saved session (A/B).
"""

from __future__ import annotations

import difflib
import json
from typing import Any

import attrs

from dsh.core.errors import DshError
from dsh.core.errors import UsageError
from dsh.core.messages import ModelRequest
from dsh.core.messages import ModelResponse
from dsh.run.replay_plan import OWN_COMPACTIONS
from dsh.run.replay_plan import Expected
from dsh.run.replay_plan import Plan
from dsh.run.replay_plan import RecordedTurn
from dsh.run.replay_plan import read_plan

#: The fields of a request, in the order a divergence is looked for.
FIELDS = ("model", "system", "tools", "options", "messages")


class ReplayStopped(DshError):
    """Raised inside the scratch run to end a turn where the replay stops or the recorded
    turn ended (never seen by the caller of :func:`replay`)."""


@attrs.frozen
class Divergence:
    """The first request today's code builds differently from the recorded one (or the first
    point where the recorded session cannot be driven, ``field == "sequence"``)."""

    #: 1-based index of the request in the session (the recorded one compared with).
    request: int
    turn: int
    #: The step of the turn, from 0.
    step: int
    #: ``model``, ``system``, ``tools``, ``options``, ``messages[I]``, ``body`` (the adapter's
    #: bytes differ, the request does not) or ``sequence`` (not the recorded sequence of
    #: requests).
    field: str
    #: A unified diff of the field's JSON, recorded (``---``) against rebuilt (``+++``).
    diff: str
    #: What happened, in one line.
    message: str
    #: ``seq`` of the recorded ``assistant/message`` (None when there is none).
    seq: int | None = None

    def __str__(self) -> str:
        return self.message


@attrs.define
class ReplayReport:
    """What :func:`replay` found: ``ok`` when every request matched."""

    session: str
    #: Requests compared and matching, in order (the recorded ones, as :class:`Expected`).
    requests: list[Any] = attrs.Factory(list)
    turns: int = 0
    divergence: Divergence | None = None
    #: What the replay could not give again, or compared otherwise (one line each).
    notes: list[str] = attrs.Factory(list)
    #: Reports of the sub-agents' sessions replayed with it.
    children: list[ReplayReport] = attrs.Factory(list)
    #: How requests were compared: ``body`` (the adapter's wire bytes) or ``json``.
    compared_as: set[str] = attrs.Factory(set)

    @property
    def ok(self) -> bool:
        return self.divergence is None and all(c.ok for c in self.children)

    @property
    def first_divergence(self) -> tuple[ReplayReport, Divergence] | None:
        """``(report, divergence)`` of the first divergent session, this one or a child."""
        if self.divergence is not None:
            return self, self.divergence
        for child in self.children:
            found = child.first_divergence
            if found is not None:
                return found
        return None

    @property
    def total_requests(self) -> int:
        return len(self.requests) + sum(c.total_requests for c in self.children)

    @property
    def total_turns(self) -> int:
        return self.turns + sum(c.total_turns for c in self.children)

    def summary(self) -> str:
        """``replay: 7 requests in 3 turns match`` (with the sub-agents' sessions counted)."""
        found = self.first_divergence
        if found is None:
            kids = f" (with {len(self.children)} sub-agent session(s))" if self.children else ""
            n, t = self.total_requests, self.total_turns
            return (f"replay: {n} request{'s' * (n != 1)} in {t} turn{'s' * (t != 1)} "
                    f"match{kids}")
        report, d = found
        where = "" if report is self else f"sub-agent session {report.session}: "
        return f"replay: {where}{d.message}"


def request_dict(request: ModelRequest) -> dict[str, Any]:
    """``request`` as dsh's own JSON (what :func:`dsh.testing.request_to_dict` gives, without
    ``stream``, which the recording does not say)."""
    from dsh.core.messages import thaw
    from dsh.ledger.serialize import dump_messages

    return {
        "model": request.model,
        "system": request.system,
        "messages": thaw(dump_messages(request.messages)),
        "tools": [{"name": t.name, "description": t.description,
                   "parameters": thaw(t.parameters)} for t in request.tools],
        "options": thaw(request.options),
    }


def _lines(value: Any) -> list[str]:
    if isinstance(value, str):
        return value.splitlines(keepends=True) or [""]
    text = json.dumps(value, ensure_ascii=False, indent=2, sort_keys=True)
    return [line + "\n" for line in text.splitlines()]


def unified(recorded: Any, rebuilt: Any, name: str) -> str:
    """A unified diff of ``name``'s value, recorded against rebuilt."""
    a, b = _lines(recorded), _lines(rebuilt)
    for side in (a, b):
        if side and not side[-1].endswith("\n"):
            side[-1] += "\n"
    return "".join(difflib.unified_diff(a, b, f"recorded/{name}", f"rebuilt/{name}"))


_ABSENT = "(absent)"


def first_difference(recorded: dict[str, Any], rebuilt: dict[str, Any]
                     ) -> tuple[str, Any, Any] | None:
    """``(field, recorded value, rebuilt value)`` of the first field that differs."""
    for name in FIELDS:
        a, b = recorded.get(name), rebuilt.get(name)
        if a == b:
            continue
        if name != "messages":
            return name, a, b
        for i in range(max(len(a), len(b))):
            x = a[i] if i < len(a) else _ABSENT
            y = b[i] if i < len(b) else _ABSENT
            if x != y:
                return f"messages[{i}]", x, y
    return None


class Driver:
    """One session's replay: the plan, where it stands, and what it found."""

    def __init__(self, app: Any, plan: Plan, report: ReplayReport) -> None:
        self.app = app
        self.plan = plan
        self.report = report
        self.next = 0  # index into plan.requests of the next request expected
        self.turn: RecordedTurn | None = None
        self.session: Any = None
        self.given_context: list[tuple[str, str]] = []
        self.given_text: str | None = None
        self._refused: dict[int, int] = {}
        self._effects_done: set[int] = set()
        self._compactions: list[tuple[int, Any]] = []

    # -- what the stand-ins ask ------------------------------------------------------------

    def note(self, text: str) -> None:
        if text not in self.report.notes:
            self.report.notes.append(text)

    def diverge(self, exp: Expected | None, field: str, diff: str, message: str) -> None:
        turn = exp.turn if exp is not None else (self.turn.number if self.turn else 0)
        if self.report.divergence is None:
            self.report.divergence = Divergence(
                request=exp.index if exp is not None else self.next + 1, turn=turn,
                step=exp.step if exp is not None else 0, field=field, diff=diff,
                message=message, seq=exp.seq if exp is not None else None)
        raise ReplayStopped(message)

    def answer(self, model: Any, request: ModelRequest) -> ModelResponse:
        """The recorded answer to ``request``, after comparing it with the recorded one."""
        turn = self.turn
        assert turn is not None
        exp = self.plan.requests[self.next] if self.next < len(self.plan.requests) else None
        if exp is None or exp.turn != turn.number:
            if turn.outcome != "completed":
                # the recorded turn ended here (an error, an abort, a budget): so does this one
                raise ReplayStopped(f"the recorded turn {turn.number} ended here "
                                    f"({turn.outcome or 'unfinished'}: {turn.reason})")
            made = len(turn.requests)
            self.diverge(None, "sequence", "",
                         f"turn {turn.number}: today's loop made a request the recording does "
                         f"not have (the recorded turn made {made} request"
                         f"{'s' * (made != 1)})")
        assert exp is not None
        refused = self._refused.get(exp.index, 0)
        if refused < exp.refusals:  # the provider refused it: its context was too long
            self._refused[exp.index] = refused + 1
            from dsh.core.errors import ProviderError

            error = ProviderError("replay: context too long (the recorded provider refused "
                                  "this request)", status=400)
            error.context_overflow = True  # type: ignore[attr-defined]
            raise error
        self.compare(model, exp, request)
        self.next += 1
        self.report.requests.append(exp)
        self._compactions = [c for c in self._compactions if c[0] > exp.index]
        if exp.steer is not None:
            context, text, source = exp.steer
            for item_text, item_source in context:
                self.session.inject(item_text, item_source)
            self.given_context = list(context)
            self.given_text = text
            self.session.steer(text, source)
        r = exp.response
        return ModelResponse(text=r.text, tool_calls=r.tool_calls, usage=r.usage,
                             stop_reason=r.stop_reason, tool_call_source=r.tool_call_source,
                             model=r.model, reasoning=r.reasoning)

    def compare(self, model: Any, exp: Expected, request: ModelRequest) -> None:
        recorded, rebuilt = request_dict(exp.request), request_dict(request)
        where = f"request {exp.index} (turn {exp.turn}, step {exp.step})"
        found = first_difference(recorded, rebuilt)
        if found is not None:
            name, a, b = found
            self.diverge(exp, name, unified(a, b, name),
                         f"{where}: {name} differs from the request recorded as sent "
                         f"(answered at seq {exp.seq})")
        try:
            sent, again = model.body(exp.request), model.body(request)
        except DshError as exc:
            self.diverge(exp, "body", "", f"{where}: the adapter cannot build the body: {exc}")
        if sent is None:
            self.report.compared_as.add("json")
            return
        self.report.compared_as.add("body")
        if sent != again:
            self.diverge(exp, "body", unified(json.loads(sent), json.loads(again), "body"),
                         f"{where}: the adapter's body differs from the one recorded as sent")

    def tool_effects(self, call_id: str) -> None:
        """Before a call's recorded result: the plugin events its step's tools wrote."""
        exp = next((e for e in reversed(self.report.requests)
                    if any(c.id == call_id for c in e.response.tool_calls)), None)
        if exp is None or exp.index in self._effects_done:
            return
        self._effects_done.add(exp.index)
        for event in exp.tool_events:
            self._append(event)

    def recorded_compaction(self) -> Any:
        """The compaction recorded before the request about to be made, once."""
        index = self.next + 1
        for i, (before, event) in enumerate(self._compactions):
            if before == index and event.strategy not in OWN_COMPACTIONS:
                del self._compactions[i]
                return event
        return None

    # -- driving ---------------------------------------------------------------------------

    def _append(self, event: Any) -> None:
        from dsh.ledger.events import ContextCompacted
        from dsh.ledger.events import PluginEvent

        ledger = self.session.ledger
        if isinstance(event, PluginEvent):
            ledger.append(PluginEvent, plugin=event.plugin, name=event.name, data=event.data,
                          version=event.version)
        elif isinstance(event, ContextCompacted):
            ledger.append(ContextCompacted, start=event.start, end=event.end,
                          messages=event.messages, strategy=event.strategy,
                          plugin=event.plugin, reason=event.reason,
                          tokens_before=event.tokens_before, tokens_after=event.tokens_after,
                          summary_session=event.summary_session)

    def agent_for(self, turn: RecordedTurn) -> Any:
        """Today's agent for a recorded turn: its agent, on a model whose recorded id is the
        turn's (the configured one, an alias resolving to it, or the id itself)."""
        from dsh.run.replay_model import install

        app = self.app
        kw = {"mode": turn.mode} if turn.mode else {}
        if turn.agent not in app.config.agent_names():
            raise UsageError(f"turn {turn.number} ran agent {turn.agent!r}, which today's config "
                             f"does not have (configured: {', '.join(app.config.agent_names())})")
        candidates: list[str | None] = [None, *app.config.models, turn.model]
        agent = None
        for model in candidates:
            try:
                agent = app.agent(turn.agent, **({"model": model} if model else {}), **kw)
                if agent.effective_model == turn.model:
                    break
            except DshError:
                agent = None
                if model == turn.model:
                    raise
        assert agent is not None
        install(agent, self)
        return agent

    def inputs(self, turn: RecordedTurn) -> list[Any]:
        if not turn.attachments:
            return []
        from dsh.llm.attachments import Input

        blobs = self.app.store
        out = []
        for att in turn.attachments:
            try:
                data = blobs.get_attachment(att.sha256)
            except DshError as exc:
                raise UsageError(f"turn {turn.number}: an attachment cannot be given again: "
                                 f"{exc}") from None
            out.append(Input(data, att.media_type, att.name))
        return out

    def run(self) -> None:
        from dsh.run.session import Session

        plan, report = self.plan, self.report
        for turn in plan.turns:
            report.notes.extend(n for n in turn.notes if n not in report.notes)
            agent = self.agent_for(turn)
            if self.session is None:
                from dsh.ledger.writer import Ledger

                self.session = Session(agent, Ledger(plan.session))
            self.session.agent = agent
            self.turn = turn
            for event in turn.before:
                self._append(event)
            self._compactions = list(turn.compactions)
            for text, source in turn.context:
                self.session.inject(text, source)
            self.given_context = list(turn.context)
            self.given_text = turn.text
            result = self.session.send(turn.text, attachments=self.inputs(turn), approve=True)
            report.turns += 1
            if report.divergence is not None:
                return
            if result.outcome == "error" and not isinstance(result.error, ReplayStopped):
                first = self.next < len(plan.requests) and plan.requests[self.next]
                if turn.outcome == "error" and (not first or first.turn != turn.number):
                    continue  # it failed where the recorded turn failed
                self.diverge(first if first and first.turn == turn.number else None,
                             "sequence", "",
                             f"turn {turn.number}: today's code failed where the recording "
                             f"went on: {result.reason}")
            left = [e for e in turn.requests if e.index > self.next]
            if left:
                exp = left[0]
                self.diverge(exp, "sequence", "",
                             f"request {exp.index} (turn {turn.number}, step {exp.step}): "
                             f"today's loop ended the turn ({result.outcome}) before making "
                             f"it; the recorded turn made {len(turn.requests)} request"
                             f"{'s' * (len(turn.requests) != 1)}")


def replay(app: Any, session: str, *, children: bool = True) -> ReplayReport:
    """Replay stored session ``session`` (an id, a unique prefix, ``latest``) of ``app``'s
    store under ``app``'s config and plugins; see the module docstring.

    :raises dsh.core.errors.UsageError: no such session, an agent today's config lacks.
    :raises dsh.core.errors.LedgerError: a ledger that cannot be read (file and line named).
    """
    reader = app.reader(session)
    return _replay(app, reader, children)


def _blobs(reader: Any) -> Any:
    """Where ``reader``'s session keeps its ``-f`` fragments (beside its ledger), or None."""
    path = getattr(reader, "path", None)
    if path is None:
        return None
    from dsh.ledger.fragments import DirectoryBlobs

    return DirectoryBlobs(path.parent)


def _replay(app: Any, reader: Any, children: bool) -> ReplayReport:
    from dsh.run.replay_model import ReplayApp

    plan = read_plan(reader.id, list(reader.events()), _blobs(reader))
    report = ReplayReport(session=reader.id)
    driver = Driver(None, plan, report)
    driver.app = ReplayApp(app.config, driver)
    driver.app._store = app.store  # the same store, read only (attachments, children)
    try:
        driver.run()
    except ReplayStopped:
        pass
    finally:
        if driver.session is not None:
            driver.session.inbox.drain()
            driver.session.close()
    if children and report.divergence is None:
        for turn in plan.turns:
            for child in turn.children:
                if not _exists(app.store, child):
                    report.notes.append(f"sub-agent session {child} is not in the store: "
                                        "not replayed")
                    continue
                report.children.append(_replay(app, app.reader(child), children))
                if not report.children[-1].ok:
                    return report
    return report


def _exists(store: Any, session: str) -> bool:
    exists = getattr(store, "exists", None)
    try:
        return bool(exists(session)) if callable(exists) else session in set(store.ids())
    except DshError:
        return False


def rerun(app: Any, session: str, model: str, *, on_session: Any = None
          ) -> tuple[str, list[Any]]:
    """Send the user inputs of stored session ``session`` again, for real, to ``model``, in
    a new saved session (``dsh replay ID --model M``): each recorded turn's message (with its
    attachments and injected context) is one turn, and each message steered in is a turn of
    its own after it; tools run under the normal approvals. ``on_session`` is called with the
    new session's id once it exists. Returns ``(new id, the turns' results)``."""
    reader = app.reader(session)
    plan = read_plan(reader.id, list(reader.events()), _blobs(reader))
    inputs: list[tuple[str, list[tuple[str, str]], tuple[Any, ...], RecordedTurn]] = []
    for turn in plan.turns:
        inputs.append((turn.text, turn.context, turn.attachments, turn))
        for exp in turn.requests:
            if exp.steer is not None:
                context, text, _source = exp.steer
                inputs.append((text, context, (), turn))
    if not inputs:
        raise UsageError(f"session {reader.id} has no user input to send again")
    agent = app.agent(plan.turns[0].agent, model=model)
    results = []
    driver = Driver(app, plan, ReplayReport(session=reader.id))
    with app.open_session(agent) as new:
        if on_session is not None:
            on_session(new.id)
        for text, context, attachments, turn in inputs:
            for item_text, source in context:
                new.inject(item_text, source)
            files = driver.inputs(attrs.evolve(turn, attachments=attachments))
            results.append(new.send(text, attachments=files))
        return new.id, results
