"""``dsh models alias``: short names for models, kept in the config file (docs/cli.md).

An alias is what docs/config.md already calls one: a ``[models.NAME]`` table with an
``adapter`` key (and a ``model`` key, the adapter's model name). Defining one writes those two
keys, removing one removes the table; both go through :mod:`dsh.config.edit`, so the file is
validated before it is written and its comments and layout are kept.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from dsh.cli.shared import State

#: A name ``-m`` can take and a shell needs no quotes for: no spaces, no control characters.
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:/@+-]{0,127}")


def _key(name: str) -> str:
    """``models.NAME`` as a dotted TOML key (NAME quoted: it may hold ``.`` or ``:``)."""
    return f"models.{json.dumps(name)}"


def _toml_string(text: str) -> str:
    """``text`` as a TOML basic string: JSON's quoting, but characters beyond U+FFFF as they
    are (JSON's surrogate-pair escapes are not TOML) and DEL escaped (TOML wants it so)."""
    return json.dumps(text, ensure_ascii=False).replace("\x7f", "\\u007f")


def target_of(name: str, settings: dict[str, Any]) -> str:
    """What an alias table stands for: ``adapter:model`` (``echo`` when the model is empty)."""
    model = settings.get("model", name)
    return f"{settings['adapter']}:{model}" if model else str(settings["adapter"])


def aliases(path: Path) -> dict[str, dict[str, Any]]:
    """``{name: settings}`` of every ``[models.NAME]`` table with an ``adapter`` key in the
    config file at ``path`` (none when there is no file)."""
    from dsh.config.loader import load_config

    if not path.exists():
        return {}
    cfg = load_config(path)
    return {k: dict(v) for k, v in cfg.models.items()
            if isinstance(v, dict) and "adapter" in v}


def rows(path: Path) -> list[dict[str, Any]]:
    """``[{name, target, adapter, model, settings}]``: ``settings`` are the table's other keys
    (their names only: a value may be a secret)."""
    return [{"name": k, "target": target_of(k, v), "adapter": v["adapter"],
             "model": v.get("model", k),
             "settings": sorted(set(v) - {"adapter", "model"})}
            for k, v in sorted(aliases(path).items())]


def text(table: list[dict[str, Any]]) -> str:
    from dsh.cli.escape import escape_controls

    width = max(len(r["name"]) for r in table)
    lines = []
    for r in table:
        extra = f"  ({', '.join(r['settings'])})" if r["settings"] else ""
        lines.append(escape_controls(f"{r['name'].ljust(width)}  -> {r['target']}{extra}",
                                     newlines=False))
    return "\n".join(lines)


def define(state: State, path: Path, name: str, target: str) -> list[str]:
    """Make ``name`` an alias of ``target``; returns notes for the user (settings of the
    target's own table, which an alias does not inherit)."""
    from dsh.config.edit import set_value
    from dsh.core.errors import UsageError

    if not NAME.fullmatch(name):
        raise UsageError(f"alias name {name!r}: use letters, digits and _ . : / @ + - "
                         "(no spaces), starting with a letter or digit")
    if name == target:
        raise UsageError(f"alias {name!r} cannot stand for itself")
    app = state.app
    models = app.config.models
    own = models.get(name)
    if own is not None and "adapter" not in own:
        raise UsageError(f"{name!r} is configured in [models.{json.dumps(name)}] as a model's "
                         "own settings, not an alias: choose another name")
    aliased = models.get(target)
    if aliased is not None and "adapter" in aliased:
        raise UsageError(f"{target!r} is itself an alias (of {target_of(target, aliased)}): "
                         "make the new alias of that model")
    prefix, _, model = target.partition(":")
    if prefix not in app.models:
        from dsh.run.model_names import did_you_mean

        raise UsageError(f"unknown model {target!r}: no adapter {prefix!r} (known: "
                         f"{', '.join(sorted(app.models))})"
                         f"{did_you_mean(target, models, app.models)}")
    set_value(path, f"{_key(name)}.adapter", _toml_string(prefix))
    set_value(path, f"{_key(name)}.model", _toml_string(model))
    notes = []
    if aliased:
        keys = ", ".join(sorted(aliased))
        notes.append(f"[models.{json.dumps(target)}] sets {keys}; an alias does not inherit "
                     f"them: set them on the alias (dsh config set "
                     f"'{_key(name)}.KEY' VALUE) if it needs them")
    return notes


def remove(path: Path, name: str) -> None:
    """Remove the alias ``name`` (its whole ``[models.NAME]`` table)."""
    from dsh.config.edit import unset_value
    from dsh.core.errors import UsageError
    from dsh.core.errors import did_you_mean

    known = aliases(path)
    if name not in known:
        raise UsageError(f"no alias {name!r} in {path}{did_you_mean(name, sorted(known))}")
    unset_value(path, _key(name))
