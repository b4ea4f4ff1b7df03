"""Context compaction: a long session keeps fitting its model's window (issue 10, MISSION C4).

The model's memory is the projection of the ledger, so compaction is one more recorded event:
``context/compacted`` says which range of the projected messages was replaced by which
messages, by which strategy and plugin. The projection applies it; the original events stay
in the ledger (nothing is deleted), a resumed session projects exactly the same history, and
the C3 check covers the result like everything else.

The package, registered as the built-in plugin ``dsh.compaction``, is split by concern
(every name below importable from ``dsh.run.compaction`` as before):

* ``estimate``: :func:`window_for` (a model's context window, from config, the adapter or a
  table), :func:`estimate_tokens` / :class:`ContextMeter` (a conservative token count of
  what the next request will carry, O(1) per step), calibrated per session by the provider's
  own count (:func:`calibrate`);
* ``strategies``: the ``compact_context`` hook's built-in implementation and its strategies,
  *observation masking* (old tool outputs replaced by a placeholder, no model call) and the
  last resort, *truncation* (the oldest whole exchanges left out);
* ``summary``: *summarisation* (the older part summarised by a model in recorded sub-runs
  that each fit the window);
* ``trigger``: when, and recording only what shrinks the next request.

When compaction runs (before a request, on a provider's context-length error, by hand) is
decided by :func:`maybe_compact` and :func:`compact_now`, called by the loop and the CLI.
"""

from __future__ import annotations

from dsh.run.compaction.estimate import MESSAGE_OVERHEAD
from dsh.run.compaction.estimate import ContextMeter
from dsh.run.compaction.estimate import agent_window
from dsh.run.compaction.estimate import calibrate
from dsh.run.compaction.estimate import context_status
from dsh.run.compaction.estimate import estimate_tokens
from dsh.run.compaction.estimate import learn_window
from dsh.run.compaction.estimate import message_tokens
from dsh.run.compaction.estimate import meter_of
from dsh.run.compaction.estimate import window_for
from dsh.run.compaction.estimate import window_from_table
from dsh.run.compaction.estimate import window_in_error
from dsh.run.compaction.strategies import DEFAULT_STRATEGY
from dsh.run.compaction.strategies import DEFAULT_THRESHOLD
from dsh.run.compaction.strategies import MASK
from dsh.run.compaction.strategies import STRATEGIES
from dsh.run.compaction.strategies import SUMMARY_CLOSE
from dsh.run.compaction.strategies import SUMMARY_OPEN
from dsh.run.compaction.strategies import SUMMARY_SYSTEM
from dsh.run.compaction.strategies import TARGET_FRACTION
from dsh.run.compaction.strategies import TRUNCATED
from dsh.run.compaction.strategies import Compaction
from dsh.run.compaction.strategies import CompactionRequest
from dsh.run.compaction.strategies import apply
from dsh.run.compaction.strategies import compact_context
from dsh.run.compaction.strategies import mask_observations
from dsh.run.compaction.strategies import split_point
from dsh.run.compaction.strategies import truncate
from dsh.run.compaction.summary import summarize
from dsh.run.compaction.summary import write_summary
from dsh.run.compaction.trigger import call_compact_context
from dsh.run.compaction.trigger import compact_now
from dsh.run.compaction.trigger import compact_session
from dsh.run.compaction.trigger import is_context_error
from dsh.run.compaction.trigger import maybe_compact
from dsh.run.compaction.trigger import record
from dsh.run.compaction.trigger import too_large

__all__ = [
    "DEFAULT_STRATEGY", "DEFAULT_THRESHOLD", "MASK", "MESSAGE_OVERHEAD", "STRATEGIES",
    "SUMMARY_CLOSE", "SUMMARY_OPEN", "SUMMARY_SYSTEM", "TARGET_FRACTION", "TRUNCATED",
    "Compaction", "calibrate", "record", "too_large", "truncate",
    "CompactionRequest", "ContextMeter", "agent_window", "apply", "call_compact_context",
    "compact_context", "compact_now", "compact_session", "context_status", "estimate_tokens",
    "is_context_error", "learn_window", "mask_observations", "maybe_compact",
    "message_tokens", "meter_of", "split_point", "summarize", "window_for",
    "window_from_table", "window_in_error", "write_summary",
]
