"""The models of the installed llm plugins, for ``dsh models`` and ``dsh llm models``.

Listing them means importing llm and every llm plugin (a second or more), so ``dsh models``
keeps the list in a cache file (``DATA_DIR/llm/models.json``, 0600) under a key that changes
when the answer could (:func:`cache_key`: an install or removal in the import path,
``LLM_LOAD_PLUGINS``, llm's ``extra-openai-models.yaml``). With the key unchanged,
``dsh models`` reads the file and imports neither llm nor its plugins. ``dsh llm models``
always asks llm, and refreshes the cache.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

#: The cache file's bound; a larger (or unreadable, or foreign) file is ignored and rewritten.
CACHE_CAP = 4 * 1024 * 1024


def rows() -> list[dict[str, Any]]:
    """Every model llm knows, as dsh ids, with its plugin (imports llm)."""
    from dsh_llm.model import import_llm
    from dsh_llm.model import plugin_of

    llm = import_llm()
    out: list[dict[str, Any]] = []
    for entry in llm.get_models_with_aliases():
        model = entry.model or entry.async_model
        out.append({
            "id": f"llm:{model.model_id}", "plugin": plugin_of(model),
            "aliases": list(entry.aliases),
            "tools": bool(getattr(model, "supports_tools", False)),
            "stream": bool(getattr(model, "can_stream", False)),
            "sync": entry.model is not None,
            "key": getattr(model, "needs_key", None),
        })
    return out


def cache_key() -> str:
    """What the listing depends on, hashed, without reading any package's metadata (that
    costs about a second in a large environment): the modification times of the import path's
    directories (installing, upgrading or removing a distribution adds or removes a
    ``*.dist-info`` directory in one of them), ``LLM_LOAD_PLUGINS``, and llm's
    ``extra-openai-models.yaml``."""
    import sys

    dirs = []
    for entry in sys.path[1:]:  # not [0]: the script's directory, or "" for `python -c`
        try:
            dirs.append(f"{entry}:{os.stat(entry or '.').st_mtime_ns}")
        except OSError:
            continue
    user = os.environ.get("LLM_USER_PATH") or ""
    extra = ""
    try:
        if not user:
            import click

            user = click.get_app_dir("io.datasette.llm")
        st = os.stat(os.path.join(user, "extra-openai-models.yaml"))
        extra = f"{st.st_size}:{st.st_mtime_ns}"
    except OSError:
        pass
    ident = {"path": dirs, "load": os.environ.get("LLM_LOAD_PLUGINS"), "user": user,
             "extra": extra, "python": sys.executable}
    return hashlib.sha256(json.dumps(ident, sort_keys=True).encode()).hexdigest()


def _cache_path() -> Path:
    from dsh.ledger.store import default_data_dir

    return default_data_dir() / "llm" / "models.json"


def list_models() -> list[dict[str, Any]]:
    """``dsh models``' listing: from the cache when its key still holds, else from llm
    (then stored). Never raises for the cache's sake."""
    key = cache_key()
    path = _cache_path()
    try:
        from dsh.core import files

        data = json.loads(files.read_regular(path, CACHE_CAP))
        if isinstance(data, dict) and data.get("key") == key and isinstance(
                data.get("models"), list):
            return [r for r in data["models"] if isinstance(r, dict) and isinstance(
                r.get("id"), str) and isinstance(r.get("plugin"), str)]
    except (OSError, ValueError, UnicodeDecodeError):
        pass
    found = rows()
    store(key, found)
    return found


def store(key: str, found: list[dict[str, Any]]) -> None:
    """Write the cache (0600, replaced atomically); a failure to write only costs time."""
    path = _cache_path()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump({"key": key, "models": found}, f)
        os.replace(tmp, path)
    except OSError:
        pass
