"""Editing the config file as a document (part of :mod:`dsh.config.edit`): one key set or
removed with tomlkit, every comment, blank line, key order and layout kept.

These functions only edit text; :mod:`dsh.config.edit` validates the settings first and reads
the edited text back to check it gives exactly them. ``None`` means "tomlkit cannot make this
edit in place" (the caller falls back to rewriting the file). tomlkit is imported here only,
and this module only by ``config set`` / ``config unset``: never on ``dsh run``'s path.
"""

from __future__ import annotations

from collections.abc import MutableMapping
from typing import Any


def set_in_text(text: str, parts: list[str], value: Any, raw: str | None = None) -> str | None:
    """``text`` with the dotted key ``parts`` set to ``value``; ``raw`` is the value as the
    person wrote it (``{ temperature = 0.2 }``, ``0x10``), kept as written when it is that
    value in TOML.

    An existing key keeps its place and its trailing comment; a new key goes after the last
    key of its table (before the comments and blank lines that follow it); a table that does
    not exist yet is created at the end of the file (``[agents.coder]``), or inline inside an
    inline table. Commented-out lines stay comments.
    """
    import tomlkit

    try:
        doc = tomlkit.parse(text)
        container: Any = doc
        for i, part in enumerate(parts[:-1]):
            if part not in container:
                _add(container, part, _new_table(container, parts[i + 1:], value, raw))
                return _tidy(text, doc.as_string())
            container = container[part]
            if not isinstance(container, MutableMapping):
                return None  # the caller's validation names it ("… is not a table")
        leaf = parts[-1]
        item = _item(value, raw)
        if leaf in container:
            container[leaf] = item  # keeps the key's place and trailing comment
        else:
            _add(container, leaf, item if _is_inline(container) else _line(item))
        return _tidy(text, doc.as_string())
    except Exception:  # noqa: BLE001 - any layout tomlkit cannot edit: the caller rewrites
        return None


def unset_in_text(text: str, parts: list[str]) -> str | None:
    """``text`` without the dotted key ``parts`` (a value or a whole table). The key must
    exist. A table it leaves empty stays (``[agents.coder]`` alone still defines the agent)."""
    import tomlkit

    try:
        doc = tomlkit.parse(text)
        container: Any = doc
        for part in parts[:-1]:
            container = container[part]
        del container[parts[-1]]
        return doc.as_string()
    except Exception:  # noqa: BLE001 - any layout tomlkit cannot edit: the caller rewrites
        return None


def same(a: Any, b: Any) -> bool:
    """``a == b`` with types compared too (``1 == 1.0 == True`` in Python, not in TOML)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


def _tidy(before: str, after: str) -> str:
    """A new table ends with a blank line (so what follows stays apart); not at the end of a
    file that did not end with one."""
    if after.endswith("\n\n") and not before.endswith("\n\n"):
        return after.rstrip("\n") + "\n"
    return after


def _line(item: Any) -> Any:
    """``item`` ending its line (a value parsed from ``v = RAW`` has no newline after it)."""
    if "\n" not in item.trivia.trail:
        item.trivia.trail += "\n"
    return item


def _is_inline(container: Any) -> bool:
    from tomlkit.items import InlineTable

    return isinstance(container, InlineTable)


def _item(value: Any, raw: str | None = None) -> Any:
    """``value`` as a tomlkit item: ``raw`` as written when it parses to exactly ``value``
    (its own comment dropped, so a replaced key keeps the file's), else built from the value
    with tables inline (a value, as ``config set`` was given it)."""
    import tomlkit

    if raw is not None:
        from tomlkit.exceptions import TOMLKitError

        try:
            item: Any = tomlkit.parse(f"v = {raw}").item("v")
        except (TOMLKitError, ValueError, KeyError):
            item = None
        if item is not None and same(item.unwrap(), value):
            item.trivia.comment = item.trivia.comment_ws = ""
            return item
    if isinstance(value, dict):
        table = tomlkit.inline_table()
        for k, v in value.items():
            table[k] = _item(v)
        return table
    if isinstance(value, list):
        array = tomlkit.array()
        for v in value:
            array.append(_item(v))
        return array
    return tomlkit.item(value)


def _new_table(container: Any, below: list[str], value: Any, raw: str | None) -> Any:
    """The new table of a missing key under ``container``; ``below`` are the key's parts
    under it, the leaf last. Inline inside an inline table; else a ``[a.b]`` table holding the
    leaf, inside an implicit super table for each level between (no header of its own)."""
    import tomlkit

    table: Any
    if _is_inline(container):
        table = tomlkit.inline_table()
        table[below[-1]] = _item(value, raw)
        for part in reversed(below[:-1]):
            inline = tomlkit.inline_table()
            inline[part] = table
            table = inline
        return table
    table = tomlkit.table()
    table.append(below[-1], _line(_item(value, raw)))
    table.append(None, tomlkit.nl())  # a blank line before whatever follows it
    for part in reversed(below[:-1]):
        outer = tomlkit.table(is_super_table=True)
        outer.append(part, table)
        table = outer
    return table


def _add(container: Any, key: str, item: Any) -> None:
    """Add ``key`` to ``container`` after its last key (a value before its sub-tables and the
    comments that follow its keys; a table at the end)."""
    from tomlkit.items import AoT
    from tomlkit.items import Table

    body_of = container.value if isinstance(container, Table) else container
    body = getattr(body_of, "body", None)
    insert_at = getattr(body_of, "_insert_at", None)
    if isinstance(item, Table | AoT) or body is None or insert_at is None:
        container[key] = item
        return
    last = max((i for i, (k, v) in enumerate(body)
                if k is not None and not isinstance(v, Table | AoT)), default=None)
    if last is None:
        first_table = next((i for i, (k, v) in enumerate(body)
                            if isinstance(v, Table | AoT)), None)
        if first_table is None:
            container[key] = item
        else:
            insert_at(first_table, key, item)
        return
    if last + 1 < len(body):
        insert_at(last + 1, key, item)
    else:
        container[key] = item
