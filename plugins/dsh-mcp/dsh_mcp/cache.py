"""The on-disk cache of each server's tool list (D1: assembly does no server I/O).

One JSON file per server config, ``<data dir>/mcp/<SERVER>-<key[:16]>.json`` (the data dir is
``$DSH_HOME``, else ``$XDG_DATA_HOME/dsh``), mode 0600 in a 0700 directory, written
atomically. The key hashes the server's command/args/env/cwd or url/headers, so a changed
config never reads another config's list, and no secret is in a file name or the file.
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


def cache_dir() -> Path:
    from dsh.ledger.store import default_data_dir

    return default_data_dir() / "mcp"


def path_for(server: Server) -> Path:
    return cache_dir() / f"{server.name}-{server.key[:16]}.json"


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
    directory = cache_dir()
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".tmp-", suffix=".json")  # 0600
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump(data, fh, ensure_ascii=False, indent=1)
        os.replace(tmp, path_for(server))
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    return data
