"""The one place events become JSON and back.

Reading goes through loaders generated from the attrs field lists (every field's type
checked), and through a cattrs converter only where they cannot: a plugin's event type with
other annotations, and explaining a line a loader refused (readable errors via
``transform_error``). Writing uses a small dumper generated the same way: it produces the same
dicts cattrs would (a round-trip test over every event type guards that). cattrs is imported
only then — never to write, nor to read the built-in types (resuming a session, listing
sessions): importing it alone costs more than a bare interpreter's start-up
(docs/architecture.md, "Start-up").
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import TYPE_CHECKING
from typing import Any

import attrs

from dsh.core.errors import LedgerError
from dsh.core.messages import Usage
from dsh.ledger.events import EVENT_TYPES
from dsh.ledger.events import SCHEMA_VERSION
from dsh.ledger.events import Event
from dsh.ledger.events import PluginEvent
from dsh.ledger.events import UnknownEvent
from dsh.ledger.parts import _OPTIONAL_STR
from dsh.ledger.parts import CHANGE_OPS as CHANGE_OPS
from dsh.ledger.parts import InvalidLine as InvalidLine
from dsh.ledger.parts import _Invalid
from dsh.ledger.parts import _usage
from dsh.ledger.parts import checked as checked
from dsh.ledger.parts import dump_attachments as dump_attachments
from dsh.ledger.parts import dump_changes as dump_changes
from dsh.ledger.parts import dump_fragments as dump_fragments
from dsh.ledger.parts import dump_messages as dump_messages
from dsh.ledger.parts import dump_reasoning as dump_reasoning
from dsh.ledger.parts import dump_usage as dump_usage
from dsh.ledger.parts import raw_attachments as raw_attachments
from dsh.ledger.parts import raw_changes as raw_changes
from dsh.ledger.parts import raw_fragments as raw_fragments
from dsh.ledger.parts import raw_messages as raw_messages
from dsh.ledger.parts import raw_reasoning as raw_reasoning
from dsh.ledger.parts import raw_tool_calls as raw_tool_calls
from dsh.ledger.parts import raw_tools as raw_tools

if TYPE_CHECKING:
    import cattrs

_ENCODER = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"))
_dumps = _ENCODER.encode


def _c_dumps() -> Callable[[Any], str] | None:
    """``_ENCODER.encode`` without its Python layers (``encode`` → ``iterencode`` → a new C
    encoder, a closure defined on every call): the same C encoder made with the same
    arguments, fresh circular-reference markers each call. The same text: a test compares
    the two on every event type."""
    from json.encoder import c_make_encoder
    from json.encoder import encode_basestring

    if c_make_encoder is None:  # pragma: no cover - CPython has it
        return None
    enc, default, join = _ENCODER, _ENCODER.default, "".join

    def dumps(obj: Any) -> str:
        return join(c_make_encoder({}, default, encode_basestring, None, enc.key_separator,
                                   enc.item_separator, False, False, True)(obj, 0))

    return dumps


#: One ledger line's text from its JSON object (compact, UTF-8 as is: ``ensure_ascii=False``).
dumps: Callable[[Any], str] = _c_dumps() or _dumps


def _plain(value: Any) -> Any:
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    if isinstance(value, (tuple, list)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if type(value) is Usage:
        return dump_usage(value)
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


#: How the generated dumpers write nested fields of the built-in events (by annotation).
_NESTED_DUMP = {
    "tuple[ToolCall, ...]":
        "[{{'id': c.id, 'name': c.name, 'arguments': c.arguments}} for c in e.{0}]",
    "Usage": "_dump_usage(e.{0})",
    "tuple[Reasoning, ...]": "_dump_reasoning(e.{0})",
    "tuple[Attachment, ...]": "_dump_attachments(e.{0})",
    "tuple[FragmentRef, ...]": "_dump_fragments(e.{0})",
    "tuple[Change, ...]": "_dump_changes(e.{0})",
    "tuple[ToolSpec, ...] | None":
        "None if e.{0} is None else [{{'name': t.name, 'description': t.description, "
        "'parameters': t.parameters}} for t in e.{0}]",
    "tuple[Message, ...]": "_dump_messages(e.{0})",
}
_PLAIN_DUMP = {"int", "str", "str | None", "float | None", "dict[str, Any]",
               "dict[str, Any] | None", "bool"}
_DUMPERS: dict[type[Event], Callable[[Event], dict[str, Any]]] = {}
#: Fields most lines have empty (attachments, reasoning parts): a line carries them only when
#: there are any, which keeps every other line as it was before they existed.
_OMITTED_WHEN_EMPTY = {"tuple[Attachment, ...]": "_dump_attachments",
                       "tuple[FragmentRef, ...]": "_dump_fragments",
                       "tuple[Change, ...]": "_dump_changes",
                       "tuple[Reasoning, ...]": "_dump_reasoning"}
#: ``turn/start`` fields written only when set, by name: older lines stay as they were.
_OMITTED_WHEN_NONE = {"trust": "_plain", "mode": "", "cwd": ""}


def _annotation(cls: type, name: str, resolved: Any) -> str:
    """The annotation as written (a string), even once cattrs has resolved the class's."""
    raws = (k.__dict__.get("__annotations__", {}).get(name) for k in cls.__mro__)
    return next((r for r in raws if isinstance(r, str)), str(resolved))


def _dumper(cls: type[Event]) -> Callable[[Event], dict[str, Any]]:
    """A generated function writing ``cls``'s JSON object in one dict display — what the
    generic path below does, several times faster on the per-step path (every event of every
    step goes through here). Classes with other annotations use the generic path."""
    dumper = _DUMPERS.get(cls)
    if dumper is not None:
        return dumper
    items = [f"'v': {SCHEMA_VERSION}", f"'type': {cls.type!r}", "'seq': e.seq", "'ts': e.ts",
             "'session': e.session"]
    if cls is PluginEvent:  # a family: each line's tag is x/PLUGIN/NAME
        items[1] = "'type': 'x/' + e.plugin + '/' + e.name"
    for f in attrs.fields(cls):
        if f.name in ("seq", "ts", "session", "extra"):
            continue
        ann = _annotation(cls, f.name, f.type)
        if f.name in _OMITTED_WHEN_NONE and cls.type == "turn/start":
            items.append(f"**({{{f.name!r}: {_OMITTED_WHEN_NONE[f.name]}(e.{f.name})}} "
                         f"if e.{f.name} is not None else {{}})")
        elif ann in _PLAIN_DUMP:
            items.append(f"{f.name!r}: e.{f.name}")
        elif ann in _OMITTED_WHEN_EMPTY:  # written only when there are any (issue 17)
            items.append(f"**({{{f.name!r}: {_OMITTED_WHEN_EMPTY[ann]}(e.{f.name})}} "
                         f"if e.{f.name} else {{}})")
        elif ann in _NESTED_DUMP:
            items.append(f"{f.name!r}: " + _NESTED_DUMP[ann].format(f.name))
        else:
            _DUMPERS[cls] = _generic_dict
            return _generic_dict
    names: dict[str, Any] = {"_dump_messages": dump_messages, "_dump_usage": dump_usage,
                             "_dump_reasoning": dump_reasoning,
                             "_dump_attachments": dump_attachments,
                             "_dump_fragments": dump_fragments,
                             "_dump_changes": dump_changes, "_plain": _plain}
    exec(f"def dump(e):\n    return {{{', '.join(items)}}}", names)  # noqa: S102 - see above
    dumper = _DUMPERS[cls] = names["dump"]
    return dumper


def event_to_dict(event: Event) -> dict[str, Any]:
    """The JSON object of one ledger line."""
    if isinstance(event, UnknownEvent):
        return dict(event.extra)
    d = _dumper(type(event))(event)
    if event.extra:
        for k, v in event.extra.items():
            if k == "v":  # a line from another schema version keeps its version
                d["v"] = v
            else:
                d.setdefault(k, v)
    return d


_EMPTY_NAMES = ("attachments", "fragments", "reasoning", "changes")


def _generic_dict(event: Event) -> dict[str, Any]:
    d: dict[str, Any] = {
        "v": SCHEMA_VERSION,
        "type": event.type,
        "seq": event.seq,
        "ts": event.ts,
        "session": event.session,
    }
    for name in _field_names(type(event)):
        value = getattr(event, name)
        if value == () and name in _EMPTY_NAMES:  # see _OMITTED_WHEN_EMPTY
            continue
        if value is None and name in _OMITTED_WHEN_NONE and event.type == "turn/start":
            continue
        if value is not None and not isinstance(value, (str, int, float, bool)):
            value = _plain(value)
        d[name] = value
    return d


def dump_event(event: Event) -> str:
    """One ledger line, without the trailing newline."""
    return dumps(event_to_dict(event))


_LINE_DUMPERS: dict[type[Event], Callable[[Event], dict[str, Any]] | None] = {}


def line_dumper(cls: type[Event]) -> Callable[[Event], dict[str, Any]] | None:
    """The generated dumper of ``cls`` for the writer's hot path: ``event_to_dict`` for an
    event whose ``extra`` is empty; None for :class:`UnknownEvent` (written from ``extra``)."""
    try:
        return _LINE_DUMPERS[cls]
    except KeyError:
        dump = _LINE_DUMPERS[cls] = None if issubclass(cls, UnknownEvent) else _dumper(cls)
        return dump


class EventCodec:
    """Structures ledger lines into events. Plugins may add event types (``extra_types``);
    a tag nobody knows loads as :class:`~dsh.ledger.events.UnknownEvent` and survives a round
    trip."""

    def __init__(self, extra_types: tuple[type[Event], ...] = ()) -> None:
        self.types: dict[str, type[Event]] = {c.type: c for c in EVENT_TYPES + extra_types}
        self._known: dict[type[Event], frozenset[str]] = {
            c: frozenset(_field_names(c)) | {"seq", "ts", "session"} for c in self.types.values()
        }
        self._allowed = {c: k | {"v", "type"} for c, k in self._known.items()}
        #: Each type's loader, made at its first line: the generated one (every built-in
        #: type), else cattrs' (a plugin's type with other annotations).
        self._structure: dict[type[Event], Callable[[Any, Any], Any]] = {}
        self._converters: tuple[cattrs.Converter, cattrs.Converter] | None = None

    def _cattrs(self) -> tuple[cattrs.Converter, cattrs.Converter]:
        """Two cattrs converters, made when first needed (importing cattrs costs more than a
        bare interpreter's start-up, and the built-in types never need it to load): a fast
        one (no detailed validation) for a plugin type the generated loaders cannot read,
        and a detailed one, used only to explain a line a loader rejected."""
        if self._converters is None:
            import cattrs.preconf.json

            self._converters = (cattrs.preconf.json.make_converter(detailed_validation=False),
                                cattrs.preconf.json.make_converter())
        return self._converters

    def _loader(self, cls: type[Event]) -> Callable[[Any, Any], Any]:
        fn = self._structure.get(cls)
        if fn is None:
            fn = self._structure[cls] = (_fast_loader(cls)
                                         or self._cattrs()[0].get_structure_hook(cls))
        return fn

    def from_dict(self, d: dict[str, Any], where: str = "") -> Event:
        tag = d.get("type")
        cls = self.types.get(tag) if isinstance(tag, str) else None
        if cls is None:
            if not isinstance(tag, str):
                raise LedgerError(f"{where}: line has no 'type'")
            if tag.startswith("x/"):  # a plugin's own event (dsh.plugin_events)
                from dsh.ledger.plugin_events import load

                return load(d, where)
            return UnknownEvent(
                seq=d.get("seq", 0) if isinstance(d.get("seq"), int) else 0,
                ts=str(d.get("ts", "")),
                session=str(d.get("session", "")),
                tag=tag,
                extra=d,
            )
        data = d
        unknown = d.keys() - self._allowed[cls]
        if unknown or d.get("v", SCHEMA_VERSION) != SCHEMA_VERSION:
            data = {k: v for k, v in d.items() if k in self._known[cls]}
            extra = {k: v for k, v in d.items() if k in unknown}
            if d.get("v", SCHEMA_VERSION) != SCHEMA_VERSION:
                extra["v"] = d["v"]
            data["extra"] = extra
        try:
            event: Event = self._loader(cls)(data, cls)
        except Exception as exc:  # _Invalid, cattrs' errors, KeyError, TypeError…
            raise LedgerError(
                f"{where}: invalid {tag!r} event: {self._explain(data, cls, exc)}") from None
        return event

    def _explain(self, data: dict[str, Any], cls: type[Event], exc: Exception) -> str:
        try:
            self._cattrs()[1].structure(data, cls)
        except Exception as detailed:
            return _describe(detailed)
        field = exc.args[0] if isinstance(exc, _Invalid) and exc.args else "?"
        if isinstance(exc, _Invalid) and len(exc.args) > 1:  # a value the type check passed
            return f"field {field!r}: {exc.args[1]}"
        return f"field {field!r} has the wrong type ({type(data.get(field)).__name__})"

    def load(self, line: str | bytes, where: str = "") -> Event:
        try:
            d = json.loads(line)
        except ValueError as exc:
            raise LedgerError(f"{where}: not JSON ({exc})") from None
        if not isinstance(d, dict):
            raise LedgerError(f"{where}: a ledger line must be a JSON object")
        return self.from_dict(d, where)


#: Plain fields: the JSON types each annotation of the built-in events accepts.
_PLAIN: dict[str, tuple[type, ...]] = {
    "int": (int,),
    "str": (str,),
    "str | None": (str, type(None)),
    "float | None": (float, int, type(None)),
    "dict[str, Any]": (dict,),
    "dict[str, Any] | None": (dict, type(None)),
}
#: Nested fields: a converter that checks and builds.
_NESTED: dict[str, Callable[[Any], Any]] = {
    "tuple[ToolCall, ...]": raw_tool_calls,
    "Usage": _usage,
    "tuple[Reasoning, ...]": raw_reasoning,
    "tuple[Attachment, ...]": raw_attachments,
    "tuple[FragmentRef, ...]": raw_fragments,
    "tuple[Change, ...]": raw_changes,
    "tuple[ToolSpec, ...] | None": raw_tools,
    "tuple[Message, ...]": raw_messages,
}


def _fast_loader(cls: type[Event]) -> Callable[[dict[str, Any], Any], Event] | None:
    """A loader for ``cls`` that checks every field strictly and builds the event directly.

    Generated as straight-line code (as attrs and cattrs generate theirs) when every field's
    annotation is one the built-in events use; plugin event types with other annotations go
    through cattrs. Several times faster than cattrs on the resume path
    (benchmarks/resume.py); any doubt raises :class:`_Invalid`, and cattrs explains.
    """
    names: dict[str, Any] = {"_Invalid": _Invalid, "cls": cls}
    body = ["def load(d, _=None):", "    kw = {}"]
    for f in attrs.fields(cls):
        if f.name == "extra":
            continue
        ann = str(f.type)
        required = f.default is attrs.NOTHING
        body.append(f"    v = d.get({f.name!r}, _Invalid)")
        body.append("    if v is not _Invalid:")
        if ann in _PLAIN:
            names[f"t_{f.name}"] = _PLAIN[ann]
            body.append(f"        if type(v) not in t_{f.name}: raise _Invalid({f.name!r})")
            body.append(f"        kw[{f.name!r}] = v")
        elif ann in _NESTED:
            names[f"c_{f.name}"] = _NESTED[ann]
            body.append("        try:")
            body.append(f"            kw[{f.name!r}] = c_{f.name}(v)")
            body.append("        except (_Invalid, KeyError, TypeError) as exc:")  # a reason kept
            body.append(f"            raise _Invalid({f.name!r}, *(exc.args[1:] if type(exc) is "
                        "_Invalid else ())) from None")
        else:
            return None
        if required:
            body.append(f"    else: raise _Invalid({f.name!r})")
    body.append("    if 'extra' in d: kw['extra'] = d['extra']")
    body.append("    return cls(**kw)")
    exec("\n".join(body), names)  # noqa: S102 - generated from the attrs field list above
    load: Callable[[dict[str, Any], Any], Event] = names["load"]
    return load


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


#: The lines :meth:`dsh.ledger.history.Projection.apply_raw` reads often (every step or turn
#: has them): the fields it does not read itself — ``(name, types, required)`` — checked here
#: as :meth:`EventCodec.from_dict` checks them. Any other line (a compaction, a rejected step)
#: is rare, and loaded whole by the codec.
_INT, _STR = (int,), (str,)
_RAW_UNREAD: dict[str, tuple[tuple[str, tuple[type, ...], bool], ...]] = {
    "user/message": (("source", _STR, False),),
    "assistant/message": (("tool_call_source", _OPTIONAL_STR, False),
                          ("model", _OPTIONAL_STR, False), ("stop_reason", _OPTIONAL_STR, False)),
    "tool/result": (("duration_ms", (float, int, type(None)), False),
                    ("changes", (list,), False)),
    "tool/call": (("call_id", _STR, True), ("name", _STR, True), ("arguments", (dict,), False),
                  ("child_session", _OPTIONAL_STR, False)),
    "context/injected": (),
    "step/start": (),
    "step/end": (("turn", _INT, True), ("step", _INT, True)),
    "turn/start": (("parent", _OPTIONAL_STR, False), ("parent_call", _OPTIONAL_STR, False),
                   ("reasoning_withheld", _INT, False), ("trust", (list, type(None)), False),
                   ("mode", _OPTIONAL_STR, False), ("cwd", _OPTIONAL_STR, False)),
    "turn/end": (("turn", _INT, True), ("outcome", _STR, True), ("reason", _STR, False)),
}


def check_raw(d: dict[str, Any]) -> None:
    """Refuse (:class:`InvalidLine`, :class:`~dsh.core.errors.LedgerError` or ``KeyError``)
    a decoded line that :meth:`EventCodec.from_dict` would refuse, so that resuming a session
    (the raw path) and reading it (``dsh sessions show``) accept exactly the same lines."""
    tag = d["type"]
    unread = _RAW_UNREAD.get(tag) if type(tag) is str else None
    if unread is None:
        if type(tag) is str and tag[:2] == "x/":
            return  # a plugin event: dsh.ledger.plugin_events.from_raw checks it
        default_codec().from_dict(d)
        return
    for name, types, required in unread:
        if (name in d or required) and type(d[name]) not in types:
            raise _Invalid(name)
    if tag == "assistant/message" and "usage" in d:
        _usage(d["usage"])
    elif tag == "tool/result" and "changes" in d:
        raw_changes(d["changes"])
