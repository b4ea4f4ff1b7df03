"""What a confined process sees of dsh: the environment allowlist, and dsh made non-dumpable.

* :func:`allowed_env` — dsh's environment filtered by :data:`dsh.sandbox.policy.BASE_ENV`
  (``PATH``, ``HOME``, ``USER``, ``LOGNAME``, ``SHELL``, ``LANG``, ``LANGUAGE``, ``LC_*``,
  ``TERM``, ``TZ``, ``TMPDIR``), the one definition dsh uses for commands (dsh-shell's
  ``process.BASE_ENV`` mirrors it). No API key, no ``DSH_*`` variable, no ``DATABASE_URL``
  reaches a child unless its caller names it; a *pattern* (``LC_*``, a ``keep`` pattern)
  never brings in a name that looks like a credential (:func:`secret_name`), only an exact
  name does. :class:`dsh.sandbox.spawn.Popen` and :func:`dsh.sandbox.run` pass it when
  given no ``env``.
* :func:`harden` — ``prctl(PR_SET_DUMPABLE, 0)`` once, before the first process starts, so
  a child running as dsh's (non-root) user cannot read ``/proc/<dsh>/environ`` or ``mem``
  (dsh-shell's ``process.harden_process`` and dsh-mcp's ``harden`` do the same for theirs).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterable


def secret_name(name: str) -> bool:
    """Whether an environment variable called ``name`` looks like it holds a credential
    (``OPENAI_API_KEY``, ``GITHUB_TOKEN``, ``PGPASSWORD``, ``AWS_SECRET_ACCESS_KEY``…;
    :func:`dsh.core.redact.credential_name`), or is one of dsh's own (``DSH_*``)."""
    from dsh.core import redact

    return name.upper().startswith("DSH_") or redact.credential_name(name)


def allowed_env(cwd: str | os.PathLike[str] | None = None,
                keep: Iterable[str] = ()) -> dict[str, str]:
    """dsh's environment as a child gets it by default: the variables :data:`BASE_ENV
    <dsh.sandbox.policy.BASE_ENV>` and ``keep`` name (exact names, or patterns with ``*?[``),
    never a :func:`secret_name` matched by a pattern; ``PWD`` is ``cwd`` when given."""
    from dsh.sandbox.policy import BASE_ENV

    wanted = (*BASE_ENV, *keep)
    exact = {w for w in wanted if not _is_pattern(w)}
    patterns = [w for w in wanted if _is_pattern(w)]
    env = {k: v for k, v in os.environ.items() if k in exact}
    if patterns:
        from fnmatch import fnmatchcase

        env.update((k, v) for k, v in os.environ.items()
                   if k not in env and any(fnmatchcase(k, p) for p in patterns)
                   and not secret_name(k))
    if cwd is not None:
        env["PWD"] = os.path.abspath(os.fspath(cwd))
    return env


def _is_pattern(name: str) -> bool:
    return any(c in name for c in "*?[")


_hardened: str | None = None  # None: not yet; "" done; else why it could not be done
_harden_lock = threading.Lock()


def harden() -> str:
    """Make dsh non-dumpable, once (``prctl(PR_SET_DUMPABLE, 0)``: ``/proc/<dsh>/environ``,
    ``mem``, ``fd/`` become root's and ``ptrace`` attach is refused); ``""`` when done, else
    why not (not Linux, prctl failed). Children are not affected: ``execve`` makes each
    program dumpable again."""
    global _hardened
    if _hardened is not None:
        return _hardened
    with _harden_lock:
        if _hardened is None:
            _hardened = _set_non_dumpable()
    return _hardened


def _set_non_dumpable() -> str:
    import sys

    if not sys.platform.startswith("linux"):
        return f"not supported on {sys.platform}"
    import ctypes

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(4, 0, 0, 0, 0) != 0:  # PR_SET_DUMPABLE
            return f"prctl failed: {os.strerror(ctypes.get_errno())}"
    except (OSError, AttributeError) as exc:
        return f"prctl unavailable: {exc}"
    return ""
