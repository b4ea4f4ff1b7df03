"""Close names for a model id nothing serves: the "did you mean" of ``unknown model``.

Only imported when a model id fails to resolve (:meth:`dsh.run.app.App.build_model`), so no
run pays for it. The candidates are the ids and aliases configured in ``[models.ID]``, the
registered adapter prefixes, and the models of dsh's model data (``dsh/core/data/models.json``)
under the adapter that serves them: a bare ``gpt-4o`` is ``openai:gpt-4o``, a bare
``claude-sonnet-4-5`` is ``anthropic:claude-sonnet-4-5``.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable

#: Which adapter serves a model family of the model data, by the start of its name. The other
#: families (llama, qwen, …) run on many servers, so no adapter is guessed for them.
FAMILIES: tuple[tuple[tuple[str, ...], str], ...] = (
    (("claude",), "anthropic"),
    (("gpt-", "chatgpt", "o1", "o3", "o4"), "openai"),
)


def provider_of(name: str) -> str | None:
    """The adapter of a bare model name by its family (``gpt-4o`` → ``openai``), or None."""
    low = name.lower()
    for starts, prefix in FAMILIES:
        if low.startswith(starts):
            return prefix
    return None


def suggestions(model_id: str, configured: Iterable[str], prefixes: Iterable[str],
                limit: int = 3) -> list[str]:
    """Up to ``limit`` model ids close to ``model_id``, best first.

    :param model_id: the id that resolved to no adapter (``gpt-4o``, ``opnai:gpt-4o``).
    :param configured: the ``[models.ID]`` ids and aliases.
    :param prefixes: the registered adapter prefixes (``echo``, ``openai``, …).
    """
    name = model_id.strip()
    prefixes = sorted(set(prefixes))
    configured = sorted(set(configured))
    out: list[str] = []

    def add(candidate: str) -> None:
        if candidate and candidate != name and candidate not in out:
            out.append(candidate)

    prefix, colon, rest = name.partition(":")
    bare = rest if colon else name
    # 1. a configured id or alias whose model part is exactly this name (gpt-4o → openai:gpt-4o)
    for c in configured:
        if c.partition(":")[2].lower() == bare.lower():
            add(c)
    # 2. a model dsh knows, under its family's adapter
    if not colon:
        from dsh.core.modeldata import lookup

        family = provider_of(name)
        if family and family in prefixes and lookup(name) is not None:
            add(f"{family}:{name}")
    # 3. a misspelt adapter prefix (opnai:gpt-4o → openai:gpt-4o)
    if colon:
        for p in difflib.get_close_matches(prefix, prefixes, n=1):
            add(f"{p}:{rest}")
    # 4. anything else that is spelt alike
    known = [*configured, *prefixes]
    for near in difflib.get_close_matches(name, known, n=limit, cutoff=0.6):
        add(near)
    return out[:limit]


def did_you_mean(model_id: str, configured: Iterable[str], prefixes: Iterable[str]) -> str:
    """``"; did you mean openai:gpt-4o?"`` (or ``"…: a, b or c?"``), or ``""``."""
    near = suggestions(model_id, configured, prefixes)
    if not near:
        return ""
    if len(near) == 1:
        return f"; did you mean {near[0]}?"
    return f"; did you mean {', '.join(near[:-1])} or {near[-1]}?"
