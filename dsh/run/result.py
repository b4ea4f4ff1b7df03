"""What a run produced (:class:`RunResult`) and its JSON form (``--json``, batch results)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import attrs

from dsh.core.messages import Usage


@attrs.frozen
class RunResult:
    """What a run produced. ``outcome`` is one of ``completed``, ``rejected``, ``stopped``,
    ``aborted``, ``budget``, ``error``; ``error`` holds the exception for ``error``."""

    output: str
    session_id: str
    outcome: str
    reason: str = ""
    steps: int = 0
    usage: Usage = Usage()
    error: BaseException | None = attrs.field(default=None, eq=False)
    path: Path | None = None
    #: The context the session's next request would carry: ``{"used", "window",
    #: "compactions"}`` (tokens; ``window`` None when unknown). See dsh.run.compaction.
    context: dict[str, Any] | None = attrs.field(default=None, eq=False)
    #: With an output schema: the answer's JSON document, parsed (None otherwise).
    value: Any = None
    #: What the run's requests cost (sub-agents' included), in the currency of the models'
    #: ``price`` tables; None when no model of the run has a price.
    cost: float | None = None

    def check(self) -> RunResult:
        """Raise the run's error, if it ended with one; return self otherwise."""
        if self.error is not None:
            raise self.error
        return self


def compact_json(data: Any) -> str:
    """One JSON line, compact, non-ASCII kept (``--json``, ``--events``, batch files)."""
    return json.dumps(data, ensure_ascii=False, separators=(",", ":"), default=str)


def _cache_usage(usage: Any) -> dict[str, int]:
    """The prompt-cache counts of a usage, when there are any (``--json``'s ``usage``)."""
    read = getattr(usage, "cache_read_tokens", 0)
    written = getattr(usage, "cache_write_tokens", 0)
    return {"cache_read_tokens": read, "cache_write_tokens": written} if read or written else {}


def _rounded(cost: float | None) -> float | None:
    """A cost to 10 decimal places (``0.00567``, not ``0.0056700000000000006``)."""
    return None if cost is None else round(cost, 10)


def result_dict(result: Any, agent: str = "", model: str = "") -> dict[str, Any]:
    """The ``--json`` object (and the last ``--events`` line) of a run's result."""
    return {
        "session": result.session_id,
        "agent": agent,
        "model": model,
        "outcome": result.outcome,
        "reason": result.reason,
        "output": result.output,
        "steps": result.steps,
        "usage": {"input_tokens": result.usage.input_tokens,
                  "output_tokens": result.usage.output_tokens,
                  **_cache_usage(result.usage)},
        "cost": _rounded(getattr(result, "cost", None)),
        "path": str(result.path) if result.path else None,
        "context": getattr(result, "context", None),
        **({"value": result.value} if getattr(result, "value", None) is not None else {}),
    }
