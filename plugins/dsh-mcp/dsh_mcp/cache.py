"""The on-disk cache of each server's tool list (D1: assembly does no server I/O).

One JSON file per server config, ``<data dir>/mcp/<SERVER>-<key[:16]>.json`` (the data dir is
``$DSH_HOME``, else ``$XDG_DATA_HOME/dsh``), mode 0600 in a 0700 directory, written
atomically. The key hashes the server's command/args/env/cwd or url/headers, so a changed
config never reads another config's list, and no secret is in a file name or the file.

A listing that failed (the server did not start, its answer could not be read) is remembered
beside it, ``<SERVER>-<key[:16]>.failed.json``, for :data:`FAILED_FOR` seconds: the runs in
that time warn at once instead of starting the server again and waiting for it.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

from dsh_mcp.settings import Server

FORMAT = 1
#: Seconds a failed listing is remembered (``dsh mcp refresh`` tries again at once).
FAILED_FOR = 60.0


def cache_dir() -> Path:
    from dsh.ledger.store import default_data_dir

    return default_data_dir() / "mcp"


def path_for(server: Server) -> Path:
    return cache_dir() / f"{server.name}-{server.key[:16]}.json"


def failure_path(server: Server) -> Path:
    return cache_dir() / f"{server.name}-{server.key[:16]}.failed.json"


def load_failure(server: Server) -> str | None:
    """Why the last listing failed, when it failed less than :data:`FAILED_FOR` seconds ago."""
    try:
        data = json.loads(failure_path(server).read_text(encoding="utf-8"))
        at, reason = float(data["failed_at"]), str(data["reason"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if data.get("key") != server.key or not 0 <= time.time() - at < FAILED_FOR:
        return None
    return f"{reason} (failed {time.time() - at:.0f}s ago; `dsh mcp refresh` tries again now)"


def store_failure(server: Server, reason: str) -> None:
    """Remember that listing ``server`` failed (best effort: a read-only data dir only loses
    the memory)."""
    try:
        _write(failure_path(server), {"format": FORMAT, "key": server.key,
                                      "failed_at": time.time(), "reason": reason})
    except OSError:
        pass


def load(server: Server) -> dict[str, Any] | None:
    """The cached listing, or None when there is none (or it is unreadable: refetched)."""
    try:
        data = json.loads(path_for(server).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("format") != FORMAT or data.get(
            "key") != server.key or not isinstance(data.get("tools"), list):
        return None
    return data


def store(server: Server, tools: list[dict[str, Any]], server_info: dict[str, Any],
          protocol: str | None) -> dict[str, Any]:
    data = {"format": FORMAT, "server": server.name, "key": server.key,
            "server_info": server_info, "protocol_version": protocol,
            "listed_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "tools": tools}
    _write(path_for(server), data)
    try:
        failure_path(server).unlink()
    except OSError:
        pass
    return data


def _write(path: Path, data: dict[str, Any]) -> None:
    """``data`` as JSON at ``path``, atomically, mode 0600 in a 0700 directory."""
    directory = path.parent
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".tmp-", suffix=".json")  # 0600
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump(data, fh, ensure_ascii=False, indent=1)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
