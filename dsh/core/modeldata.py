"""What dsh knows about common models: context windows and prices (issue 17).

The facts live in one data file shipped with the package, ``dsh/core/data/models.json``, read on
the first :func:`lookup` of the process — only when a window or a price is needed that the
config does not give (``dsh --help`` never reads it; nor does a run whose model has both
``[models.ID] price`` and a ``context_window``). The config always wins:
:func:`price_for` lays a ``[models.ID] price`` table over the file's, key by key.

A name is matched by the longest id or alias of the file that it starts with, after any
``adapter:`` part and any ``vendor/`` part, so ``anthropic:claude-sonnet-4-5-20250929``,
``openai:anthropic/claude-sonnet-4.5`` and ``ollama``'s ``qwen2.5:7b`` all find their entry.

Prices are US dollars per million tokens: ``input``, ``output``, ``cache_read`` (input read
from a prompt cache), ``cache_write`` (input written to it; ``None``: billed as input) and
``cache_write_1h`` (Anthropic's 1-hour cache).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from functools import lru_cache
from typing import Any

import attrs

#: The data file (package data: ``[tool.setuptools.package-data]`` in pyproject.toml).
DATA_FILE = os.path.join(os.path.dirname(__file__), "data", "models.json")
PRICE_KEYS = ("input", "output", "cache_read", "cache_write", "cache_write_1h")


@attrs.frozen(kw_only=True)
class Price:
    """US dollars per million tokens; ``None`` where nothing says."""

    input: float | None = None
    output: float | None = None
    cache_read: float | None = None
    cache_write: float | None = None
    cache_write_1h: float | None = None

    def pair(self) -> tuple[float, float] | None:
        """``(input, output)``, as the cost budget takes it; ``None`` when neither is known."""
        if self.input is None and self.output is None:
            return None
        return float(self.input or 0.0), float(self.output or 0.0)


@attrs.frozen(kw_only=True)
class ModelFacts:
    """One entry of the data file: the ``id`` it is listed under and what is known."""

    id: str
    context_window: int | None = None
    max_output: int | None = None
    price: Price | None = None
    aliases: tuple[str, ...] = ()


def _facts(model_id: str, raw: Mapping[str, Any]) -> ModelFacts:
    where = f"{DATA_FILE}: models.{model_id}"
    unknown = set(raw) - {"context_window", "max_output", "price", "aliases"}
    if unknown:
        raise ValueError(f"{where}: unknown key(s) {', '.join(sorted(unknown))}")
    price = raw.get("price")
    if price is not None:
        extra = set(price) - set(PRICE_KEYS)
        if extra:
            raise ValueError(f"{where}: unknown price key(s) {', '.join(sorted(extra))}")
        price = Price(**{k: float(v) for k, v in price.items()})
    return ModelFacts(id=model_id, context_window=raw.get("context_window"),
                      max_output=raw.get("max_output"), price=price,
                      aliases=tuple(raw.get("aliases", ())))


@lru_cache(maxsize=1)
def table() -> dict[str, ModelFacts]:
    """``{name: facts}`` for every id and alias of the data file (read once a process: the
    file is part of the installed package and does not change under it)."""
    import json

    with open(DATA_FILE, encoding="utf-8") as f:  # JSON: ~50 µs, where TOML took ~2 ms
        data = json.load(f)
    names: dict[str, ModelFacts] = {}
    for model_id, raw in data.get("models", {}).items():
        facts = _facts(model_id, raw)
        for name in (model_id, *facts.aliases):
            names[name.lower()] = facts
    return names


@lru_cache(maxsize=1)
def _longest() -> int:
    """The length of the longest id or alias in the data file."""
    return max(map(len, table()), default=0)


def candidates(model_id: str, limit: int | None = None) -> list[str]:
    """The forms of ``model_id`` to match: whole and after each ``:``, each also without
    its first ``/``-separated part (one ``vendor/``: a file path's last part is not a model
    name, so ``scripted:/tmp/gpt-4o.json`` matches nothing). ``limit``: each form cut to its
    first ``limit`` characters (all a prefix match can use), so the forms of an id of any
    length take O(its length) to make."""
    name = model_id.strip().lower()
    starts = [0] + [i + 1 for i, ch in enumerate(name) if ch == ":"]
    slash = [-1] * (len(name) + 1)  # the first "/" at or after each position
    found = -1
    for k in range(len(name) - 1, -1, -1):
        if name[k] == "/":
            found = k
        slash[k] = found
    out: list[str] = []
    for a in starts:
        out.append(name[a:] if limit is None else name[a:a + limit])
        s = slash[a]
        if s > a and s + 1 < len(name):  # a vendor part and something after it
            out.append(name[s + 1:] if limit is None else name[s + 1:s + 1 + limit])
    return [f for f in out if f]


def lookup(model_id: str) -> ModelFacts | None:
    """What the data file says about ``model_id`` (``gpt-4o-mini``, ``openai:gpt-4o``,
    ``anthropic:claude-sonnet-4-5-20250929``), or ``None``: the longest id or alias that one
    of its :func:`candidates` starts with."""
    names = table()
    longest = _longest()  # no longer prefix can match: an id of any length costs O(its size)
    best: tuple[int, ModelFacts] | None = None
    for form in candidates(model_id, longest):
        for length in range(len(form), 0, -1):
            facts = names.get(form[:length])
            if facts is not None:
                if best is None or length > best[0]:
                    best = (length, facts)
                break
    return best[1] if best else None


def window(model_id: str) -> int | None:
    """The context window of ``model_id`` from the data file, or ``None``."""
    facts = lookup(model_id)
    return facts.context_window if facts else None


def price_for(model_id: str, configured: Mapping[str, Any] | None = None) -> Price | None:
    """The price of ``model_id``: the config's ``price`` table (``configured``) over the data
    file's, key by key; the file is not read when the config gives input and output."""
    given = {k: float(v) for k, v in (configured or {}).items() if k in PRICE_KEYS}
    if "input" in given and "output" in given:
        return Price(**given)
    facts = lookup(model_id)
    base = facts.price if facts and facts.price else None
    if base is None:
        return Price(**given) if given else None
    return attrs.evolve(base, **given)
