"""The terminal escaping of :mod:`dsh.core.escape`, under the name plugins have imported it by
(it moved down to ``dsh.core`` so that the trust question and every reader below the command
line can use it)."""

from __future__ import annotations

from dsh.core.escape import escape_controls
from dsh.core.escape import escape_json_controls
from dsh.core.escape import one_line
from dsh.core.escape import use_color

__all__ = ["escape_controls", "escape_json_controls", "one_line", "use_color"]
