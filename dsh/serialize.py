"""The one place events become JSON and back.

Reading goes through a cattrs converter (validation, nested classes, readable errors via
``transform_error``). Writing uses a small dumper generated from the attrs field lists: it
produces the same dicts cattrs would (a round-trip test over every event type guards that),
but avoids importing cattrs on the write path, which alone costs more than a bare interpreter's
start-up (docs/architecture.md, "Start-up").
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import TYPE_CHECKING
from typing import Any

import attrs

from dsh.errors import LedgerError
from dsh.events import EVENT_TYPES
from dsh.events import SCHEMA_VERSION
from dsh.events import Event
from dsh.events import UnknownEvent

if TYPE_CHECKING:
    import cattrs

_BASE_KEYS = ("v", "type", "seq", "ts", "session")
_dumps = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode


def _plain(value: Any) -> Any:
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    if isinstance(value, (tuple, list)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if attrs.has(type(value)):
        return {f.name: _plain(getattr(value, f.name)) for f in attrs.fields(type(value))}
    raise TypeError(f"cannot serialise {type(value).__name__}")


_FIELDS: dict[type[Event], tuple[str, ...]] = {}


def _field_names(cls: type[Event]) -> tuple[str, ...]:
    names = _FIELDS.get(cls)
    if names is None:
        skip = {"seq", "ts", "session", "extra"}
        names = _FIELDS[cls] = tuple(f.name for f in attrs.fields(cls) if f.name not in skip)
    return names


def event_to_dict(event: Event) -> dict[str, Any]:
    """The JSON object of one ledger line."""
    if isinstance(event, UnknownEvent):
        return dict(event.extra)
    d: dict[str, Any] = {
        "v": SCHEMA_VERSION,
        "type": event.type,
        "seq": event.seq,
        "ts": event.ts,
        "session": event.session,
    }
    for name in _field_names(type(event)):
        value = getattr(event, name)
        if value is not None and not isinstance(value, (str, int, float, bool)):
            value = _plain(value)
        d[name] = value
    if event.extra:
        for k, v in event.extra.items():
            if k == "v":  # a line from another schema version keeps its version
                d["v"] = v
            else:
                d.setdefault(k, v)
    return d


def dump_event(event: Event) -> str:
    """One ledger line, without the trailing newline."""
    return _dumps(event_to_dict(event))


class EventCodec:
    """Structures ledger lines into events. Plugins may add event types (``extra_types``);
    a tag nobody knows loads as :class:`~dsh.events.UnknownEvent` and survives a round trip."""

    def __init__(self, extra_types: tuple[type[Event], ...] = ()) -> None:
        import cattrs.preconf.json

        self.types: dict[str, type[Event]] = {c.type: c for c in EVENT_TYPES + extra_types}
        self._conv: cattrs.Converter = cattrs.preconf.json.make_converter()
        self._known: dict[type[Event], frozenset[str]] = {
            c: frozenset(_field_names(c)) | {"seq", "ts", "session"} for c in self.types.values()
        }
        self._structure: dict[type[Event], Callable[[Any, Any], Any]] = {
            c: self._conv.get_structure_hook(c) for c in self.types.values()
        }

    def from_dict(self, d: dict[str, Any], where: str = "") -> Event:
        tag = d.get("type")
        cls = self.types.get(tag) if isinstance(tag, str) else None
        if cls is None:
            if not isinstance(tag, str):
                raise LedgerError(f"{where}: line has no 'type'")
            return UnknownEvent(
                seq=d.get("seq", 0) if isinstance(d.get("seq"), int) else 0,
                ts=str(d.get("ts", "")),
                session=str(d.get("session", "")),
                tag=tag,
                extra=d,
            )
        known = self._known[cls]
        data: dict[str, Any] = {}
        extra: dict[str, Any] = {}
        for k, v in d.items():
            if k in known:
                data[k] = v
            elif k not in _BASE_KEYS or (k == "v" and v != SCHEMA_VERSION):
                extra[k] = v
        if extra:
            data["extra"] = extra
        try:
            event: Event = self._structure[cls](data, cls)
            return event
        except Exception as exc:  # cattrs raises ClassValidationError, KeyError, TypeError…
            raise LedgerError(f"{where}: invalid {tag!r} event: {_describe(exc)}") from None

    def load(self, line: str | bytes, where: str = "") -> Event:
        try:
            d = json.loads(line)
        except ValueError as exc:
            raise LedgerError(f"{where}: not JSON ({exc})") from None
        if not isinstance(d, dict):
            raise LedgerError(f"{where}: a ledger line must be a JSON object")
        return self.from_dict(d, where)


def _describe(exc: BaseException) -> str:
    import cattrs

    if isinstance(exc, cattrs.BaseValidationError):
        return "; ".join(cattrs.transform_error(exc))
    return f"{type(exc).__name__}: {exc}"


_DEFAULT: list[EventCodec] = []


def default_codec() -> EventCodec:
    if not _DEFAULT:
        _DEFAULT.append(EventCodec())
    return _DEFAULT[0]


def load_event(line: str | bytes) -> Event:
    """Parse one ledger line with the built-in event types."""
    return default_codec().load(line)
