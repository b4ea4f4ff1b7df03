"""Tokens and cost read from a session's ledger: per turn, per sub-agent and in total
(``dsh sessions show``, ``/cost`` in chat), from a listing's per-model usage
(:func:`cost_of`, ``SessionInfo.usage``), and the ``dsh run -u`` line (:func:`usage_line`).

A response is priced at the model its turn recorded (``turn/start`` ``model``), else at the
one the provider reported (``assistant/message`` ``model``), through a ``price_lookup``:
``model id -> (input, output[, cache_read, cache_write])`` per million tokens, or None when
the model has no price (:func:`app_prices` reads ``[models."ID"] price`` and the shared price
table). A cost is None when no response with tokens was priced; when only some were, it is
what those cost and :attr:`Tally.unpriced` says how many were not. The arithmetic of one
response is :func:`dsh.run.budget.request_cost`, the budget's own.
"""

from __future__ import annotations

from collections.abc import Callable
from collections.abc import Iterable
from typing import Any

#: ``model id -> price per million tokens`` (``(input, output, cache_read, cache_write)``).
PriceLookup = Callable[[str], "tuple[float | None, ...] | None"]

#: How deep sub-agent sessions are read (as deep as ``sessions show`` nests them).
MAX_DEPTH = 8


class Tally:
    """Tokens, responses and cost of some responses (a turn, a session, a sub-agent)."""

    __slots__ = ("input_tokens", "output_tokens", "cache_read_tokens", "cache_write_tokens",
                 "responses", "cost", "unpriced")

    def __init__(self) -> None:
        self.input_tokens = 0
        self.output_tokens = 0
        self.cache_read_tokens = 0
        self.cache_write_tokens = 0
        self.responses = 0
        #: None until a response with tokens was priced.
        self.cost: float | None = None
        #: Responses with tokens whose model has no price.
        self.unpriced = 0

    def add_usage(self, usage: Any, price: Any) -> None:
        """Count one response's ``usage``, priced at ``price`` (None: no price)."""
        self.input_tokens += max(0, usage.input_tokens)
        self.output_tokens += max(0, usage.output_tokens)
        self.cache_read_tokens += max(0, usage.cache_read_tokens)
        self.cache_write_tokens += max(0, usage.cache_write_tokens)
        self.responses += 1
        if not (usage.input_tokens or usage.output_tokens):
            return
        if price is None:
            self.unpriced += 1
            return
        from dsh.run.budget import request_cost

        self.cost = (self.cost or 0.0) + request_cost(usage, price)

    def add(self, other: Tally) -> None:
        """Add another tally (a sub-agent's to its parent's)."""
        self.input_tokens += other.input_tokens
        self.output_tokens += other.output_tokens
        self.cache_read_tokens += other.cache_read_tokens
        self.cache_write_tokens += other.cache_write_tokens
        self.responses += other.responses
        self.unpriced += other.unpriced
        if other.cost is not None:
            self.cost = (self.cost or 0.0) + other.cost

    @property
    def counted(self) -> bool:
        """Whether any token was counted."""
        return bool(self.input_tokens or self.output_tokens)

    def as_dict(self) -> dict[str, Any]:
        """The tally as JSON data (``cost`` null when unknown)."""
        return {"input_tokens": self.input_tokens, "output_tokens": self.output_tokens,
                "cache_read_tokens": self.cache_read_tokens,
                "cache_write_tokens": self.cache_write_tokens, "responses": self.responses,
                "cost": self.cost, "unpriced": self.unpriced}


class SessionCost:
    """A session's tallies: ``own`` (its responses), ``turns`` (by turn number, its own
    responses), ``children`` (by child session id, each a :class:`SessionCost`) and
    ``total`` (its own and every sub-agent's)."""

    __slots__ = ("own", "turns", "children", "total")

    def __init__(self) -> None:
        self.own = Tally()
        self.turns: dict[int, Tally] = {}
        self.children: dict[str, SessionCost] = {}
        self.total = Tally()


def price_of(lookup: PriceLookup, configured: str, reported: str | None) -> Any:
    """The price of a response: its turn's model's, else the reported model's, else None."""
    for model in (configured, reported):
        if model:
            price = lookup(model)
            if price is not None:
                return price
    return None


def session_cost(events: Iterable[Any], price_lookup: PriceLookup,
                 children: Callable[[str], Iterable[Any]] | None = None,
                 depth: int = 0) -> SessionCost:
    """The tallies of a session's events; with ``children`` (reads a session's events, as
    ``store.read``), its sub-agents' too (a child that cannot be read counts nothing)."""
    from dsh.core.errors import DshError

    out = SessionCost()
    model = ""
    turn: Tally | None = None
    for e in events:
        kind = getattr(e, "type", "")
        if kind == "turn/start":
            model = e.model or model
            turn = out.turns.setdefault(e.turn, Tally())
        elif kind == "assistant/message":
            price = price_of(price_lookup, model, e.model)
            out.own.add_usage(e.usage, price)
            if turn is None:
                turn = out.turns.setdefault(0, Tally())
            turn.add_usage(e.usage, price)
        elif (kind == "tool/call" and e.child_session and children is not None
              and depth < MAX_DEPTH and e.child_session not in out.children):
            try:
                child = session_cost(children(e.child_session), price_lookup, children,
                                     depth + 1)
            except DshError:
                continue
            out.children[e.child_session] = child
    out.total.add(out.own)
    for child in out.children.values():
        out.total.add(child.total)
    return out


def cost_of(usage_by_model: Iterable[tuple[str, int, int, int, int]],
            price_lookup: PriceLookup) -> float | None:
    """The cost of ``SessionInfo.usage`` — ``(model, input, output, cache_read,
    cache_write)`` per model —, None when no model with tokens has a price (the models that
    have one, when only some do)."""
    from dsh.core.messages import Usage
    from dsh.run.budget import request_cost

    cost: float | None = None
    for model, inp, out, read, write in usage_by_model:
        if not (inp or out):
            continue
        price = price_lookup(model) if model else None
        if price is None:
            continue
        usage = Usage(input_tokens=inp, output_tokens=out, cache_read_tokens=read,
                      cache_write_tokens=write)
        cost = (cost or 0.0) + request_cost(usage, price)
    return cost


def app_prices(app: Any) -> PriceLookup:
    """The price lookup of ``app``'s config (``[models."ID"] price`` over the shared price
    table), each model looked up once."""
    from dsh.run.budget import model_price

    models = app.config.models
    memo: dict[str, Any] = {}

    def lookup(model: str) -> Any:
        if model not in memo:
            memo[model] = model_price(model, models.get(model)) if model else None
        return memo[model]

    return lookup


def format_cost(cost: float | None) -> str:
    """``$0.0123`` (6 decimals below a cent), ``cost unknown`` for None."""
    if cost is None:
        return "cost unknown"
    return f"${cost:.4f}" if cost >= 0.01 or cost == 0 else f"${cost:.6f}"


def tokens_text(t: Any) -> str:
    """``N in (R cache read, W cache write) / M out tokens`` of a tally or a usage."""
    read = getattr(t, "cache_read_tokens", 0)
    write = getattr(t, "cache_write_tokens", 0)
    cache = f" ({read} cache read, {write} cache write)" if read or write else ""
    return f"{t.input_tokens} in{cache} / {t.output_tokens} out tokens"


def tally_text(t: Tally) -> str:
    """``N in / M out tokens, $0.0123`` (with how many responses had no price, if some)."""
    text = f"{tokens_text(t)}, {format_cost(t.cost)}"
    if t.unpriced and t.cost is not None:
        text += f" (+ {t.unpriced} response{'s' if t.unpriced != 1 else ''} with no price)"
    return text


def usage_line(usage: Any, cost: float | None) -> str:
    """The ``dsh run -u`` line: ``usage: N in / M out tokens, $0.0123`` (or ``cost
    unknown``)."""
    return f"usage: {tokens_text(usage)}, {format_cost(cost)}"
