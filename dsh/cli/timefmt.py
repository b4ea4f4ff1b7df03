"""Times as the command line shows them: light enough for ``dsh sessions list`` to import
without the renderer of ``dsh sessions show``."""

from __future__ import annotations

from datetime import datetime


def local_time(ts: str) -> str:
    """``2026-11-30T14:25:01.123Z`` as local ``2026-11-30 15:25``; unparseable text as is."""
    try:
        return datetime.fromisoformat(ts).astimezone().strftime("%Y-%m-%d %H:%M")
    except ValueError:
        return ts
