"""The msgpack codec every socket in danube-zmq speaks, inproc and tcp alike.

A message is a frozen, slotted, keyword-only dataclass with an explicit integer
`TAG`. On the wire it is one msgpack array: `[tag, field_1, field_2, ...]` in the
order the fields are declared. Nested records (`Struct` subclasses, no tag) are
arrays of their fields. Decoding checks every field against its annotation, so a
bad frame is an `InvalidArgument` naming the message and field, never a crash and
never a half-built object. No pickle, no extension types, no reflection beyond the
tag table each boundary builds once (`Protocol`).

Trailing fields that have defaults may be omitted by the sender (older peers);
extra fields are rejected, except by a protocol declared with `ignore_newer_fields`
(peers of one cluster during a rolling upgrade: a newer peer's trailing fields are
dropped from the top-level message, as protobuf skips unknown fields).
"""

from __future__ import annotations

import dataclasses
import operator
import reprlib
import struct
import threading
import types
import typing
from collections.abc import Callable, Iterable
from typing import Any, ClassVar

import msgpack

from danube_zmq.transport.errors import InvalidArgument

# Frames are bounded by ZMQ_MAXMSGSIZE on the socket; these caps are the decoder's
# own second line so a frame that got through can still not ask for more.
_STR_LEN_MAX = 1 << 20
_ARRAY_LEN_MAX = 1 << 20
_MAP_LEN_MAX = 1 << 16

Check = Callable[[Any, str], Any]


class Struct:
    """A nested record: encoded as the array of its fields, no tag."""

    __slots__ = ()
    _fields: ClassVar[tuple[str, ...]] = ()
    _checks: ClassVar[tuple[Check, ...]] = ()
    _required: ClassVar[int] = 0
    _wheres: ClassVar[tuple[str, ...]] = ()  # "Class.field", each field's place in a decode error
    # The fields' values as a tuple (one C call), when no field can hold a nested
    # record; None otherwise (each value is then looked at).
    _values: ClassVar[Callable[[Any], tuple[Any, ...]] | None] = None
    # (items, where) -> instance: each field checked, the slots filled (`_compile_builder`).
    _from_items: ClassVar[Callable[[list[Any], str], Any]]

    def to_wire(self) -> list[Any]:
        if self._values is not None:
            return list(self._values(self))
        return [_to_wire(getattr(self, name)) for name in self._fields]


class Message(Struct):
    """A top-level message with an explicit integer tag, unique within its `Protocol`."""

    __slots__ = ()
    TAG: ClassVar[int] = 0

    def to_wire(self) -> list[Any]:
        if self._values is not None:
            return [self.TAG, *self._values(self)]
        out = [self.TAG]
        out.extend(_to_wire(getattr(self, name)) for name in self._fields)
        return out


def _to_wire(value: Any) -> Any:
    if isinstance(value, Struct):
        return value.to_wire()
    if type(value) is list and value and isinstance(value[0], Struct):
        return [item.to_wire() for item in value]
    return value


def _shown(value: Any) -> str:
    """A short repr of a value a peer sent: reprlib stops at a depth and a count, where
    repr() of arrays nested 1,000 deep (msgpack allows 1,023) raises RecursionError and
    of a million-item list builds megabytes."""
    return _REPR.repr(value)


_REPR = reprlib.Repr()
_REPR.maxlevel, _REPR.maxlist, _REPR.maxdict, _REPR.maxstring, _REPR.maxother = 3, 4, 4, 60, 60


def _fail(where: str, expected: str, value: Any) -> InvalidArgument:
    shown = _shown(value)
    if len(shown) > 60:
        shown = shown[:57] + "..."
    return InvalidArgument(f"bad field {where}: expected {expected}, got {shown}")


def _check_for(tp: Any) -> Check:
    """Build a validator (value, where) -> value for one annotation."""
    origin = typing.get_origin(tp)
    if tp is int:
        def check_int(v: Any, where: str) -> int:
            if type(v) is not int:
                raise _fail(where, "an integer", v)
            return v
        return check_int
    if tp is float:
        def check_float(v: Any, where: str) -> float:
            if type(v) is int:
                return float(v)
            if type(v) is not float:
                raise _fail(where, "a number", v)
            return v
        return check_float
    if tp is bool:
        def check_bool(v: Any, where: str) -> bool:
            if type(v) is not bool:
                raise _fail(where, "a boolean", v)
            return v
        return check_bool
    if tp is str:
        def check_str(v: Any, where: str) -> str:
            if type(v) is not str:
                raise _fail(where, "a string", v)
            return v
        return check_str
    if tp is bytes:
        def check_bytes(v: Any, where: str) -> bytes:
            if type(v) is not bytes:
                raise _fail(where, "binary", v)
            return v
        return check_bytes
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) != 1 or len(typing.get_args(tp)) != 2:
            raise TypeError(f"only `X | None` unions are supported, not {tp}")
        inner = _check_for(args[0])

        def check_optional(v: Any, where: str) -> Any:
            return None if v is None else inner(v, where)
        return check_optional
    if origin is list:
        (item_tp,) = typing.get_args(tp)
        return _list_check(item_tp)
    if origin is dict:
        key_tp, value_tp = typing.get_args(tp)
        if key_tp is not str:
            raise TypeError("dict keys must be str")
        value_check = _check_for(value_tp)

        def check_dict(v: Any, where: str) -> dict[str, Any]:
            if type(v) is not dict:
                raise _fail(where, "a map", v)
            for key, item in v.items():
                if type(key) is not str:
                    raise _fail(where, "string keys", key)
                value_check(item, f"{where}[{key!r}]")
            return v
        return check_dict
    if isinstance(tp, type) and issubclass(tp, Struct) and not issubclass(tp, Message):
        def check_struct(v: Any, where: str) -> Struct:
            return _build(tp, v, where)
        return check_struct
    raise TypeError(f"unsupported field type {tp!r}")


def _list_check(item_tp: Any) -> Check:
    # Fast paths for the hot columns (payloads, publish times): one C-level pass.
    if item_tp in (bytes, int, str):
        name = {bytes: "binary", int: "integer", str: "string"}[item_tp]

        only = {item_tp}

        def check_scalar_list(v: Any, where: str) -> list[Any]:
            if type(v) is not list:
                raise _fail(where, f"a list of {name}", v)
            # The set of the items' types, built in C: 26 µs for 1,000 items against 42
            # for a generator asking each.
            if v and set(map(type, v)) != only:
                bad = next(item for item in v if type(item) is not item_tp)
                raise _fail(where, f"a list of {name}", bad)
            return v
        return check_scalar_list
    item_check = _check_for(item_tp)

    def check_list(v: Any, where: str) -> list[Any]:
        if type(v) is not list:
            raise _fail(where, "a list", v)
        return [item_check(item, f"{where}[{i}]") for i, item in enumerate(v)]
    return check_list


def _build(cls: type[Struct], items: Any, where: str) -> Any:
    if type(items) is not list:
        raise _fail(where, f"a {cls.__name__} array", items)
    return cls._from_items(items, where)


def _count_error(cls: type[Struct], where: str, got: int) -> InvalidArgument:
    return InvalidArgument(f"bad {where}: {cls.__name__} takes {cls._required}..{len(cls._fields)} fields, got {got}")


# Checks that `_compile_builder` writes inline: the value's exact type, and what a decode
# error says it expected.
_INLINE = {int: "an integer", str: "a string", bytes: "binary", bool: "a boolean"}


def _compile_builder(cls: type[Struct], hints: dict[str, Any], fields: tuple[dataclasses.Field[Any], ...]) -> None:
    """Give `cls` its `_from_items(items, where)`: checks each field and fills the slots.

    Written out per class once, as dataclasses writes `__init__`: a one-message `Send`
    decodes in about a third of the time a loop over the field checks and a keyword call
    of the frozen `__init__` took. The scalar checks are inline; other fields call their
    `_checks` entry; a field's place in an error is formed only when there is an error
    (for nested records and containers, whose items' errors need it, before the call)."""
    names = cls._fields
    env: dict[str, Any] = {"_new": object.__new__, "_cls": cls, "_fail": _fail, "_count_error": _count_error,
                           "_name": cls.__name__, "_wheres": cls._wheres}
    lines = ["def _from_items(items, where):", "    n = len(items)",
             f"    if n > {len(names)} or n < {cls._required}:", "        raise _count_error(_cls, where, n)",
             "    o = _new(_cls)"]
    for i, (f, name) in enumerate(zip(fields, names, strict=True)):
        tp = hints[name]
        env[f"_set{i}"] = getattr(cls, name).__set__
        place = f"(_wheres[{i}] if where == _name else where + {'.' + name!r})"
        optional = typing.get_origin(tp) in (typing.Union, types.UnionType) and type(None) in typing.get_args(tp)
        if optional:
            (tp,) = [a for a in typing.get_args(tp) if a is not type(None)]
        # A field the sender left out takes its default, unchecked (as the constructor would).
        indent = "        " if i >= cls._required else "    "
        if i >= cls._required:
            lines.append(f"    if n > {i}:")
        lines.append(f"{indent}v = items[{i}]")
        if tp in _INLINE:
            test = f"type(v) is not {tp.__name__}"
            if optional:
                test = f"v is not None and {test}"
            env[f"_expect{i}"] = _INLINE[tp]
            lines += [f"{indent}if {test}:", f"{indent}    raise _fail({place}, _expect{i}, v)"]
        elif optional:
            env[f"_check{i}"] = _check_for(tp)
            lines += [f"{indent}if v is not None:", f"{indent}    v = _check{i}(v, {place})"]
        else:
            env[f"_check{i}"] = cls._checks[i]
            lines.append(f"{indent}v = _check{i}(v, {place})")
        if i >= cls._required:
            if f.default is not dataclasses.MISSING:
                env[f"_default{i}"] = f.default
                lines += ["    else:", f"        v = _default{i}"]
            else:
                env[f"_factory{i}"] = f.default_factory
                lines += ["    else:", f"        v = _factory{i}()"]
        lines.append(f"    _set{i}(o, v)")
    lines.append("    return o")
    exec("\n".join(lines), env)  # code written from the class's own annotations, as dataclasses does
    cls._from_items = staticmethod(env["_from_items"])


def _may_nest(tp: Any) -> bool:
    """Whether a value of this annotation may hold a `Struct` (then encoded as an array)."""
    if isinstance(tp, type) and issubclass(tp, Struct):
        return True
    if tp is Any or isinstance(tp, typing.TypeVar):
        return True
    return any(_may_nest(arg) for arg in typing.get_args(tp))


def wire(cls: type) -> type:
    """Class decorator: make `cls` a frozen slotted kw-only dataclass and compile its checks."""
    cls = dataclasses.dataclass(frozen=True, slots=True, kw_only=True)(cls)
    hints = typing.get_type_hints(cls)
    fields = dataclasses.fields(cls)
    cls._fields = tuple(f.name for f in fields)
    cls._checks = tuple(_check_for(hints[f.name]) for f in fields)
    cls._wheres = tuple(f"{cls.__name__}.{f.name}" for f in fields)
    if len(fields) > 1 and not any(_may_nest(hints[f.name]) for f in fields):
        # An attrgetter of several names gives a tuple (of one, the value alone), and it
        # is no descriptor: as a class attribute it is called with the message alone.
        cls._values = operator.attrgetter(*cls._fields)
    required = 0
    for i, f in enumerate(fields):
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            required = i + 1
    cls._required = required
    _compile_init(cls, fields)
    _compile_builder(cls, hints, fields)
    return cls


_NO_VALUE = object()


def _compile_init(cls: type[Struct], fields: tuple[dataclasses.Field[Any], ...]) -> None:
    """Replace the frozen dataclass's `__init__` with one that fills the slots through
    their descriptors: the same keyword-only signature and defaults, at about half the
    cost of `object.__setattr__` per field (every message on the data path is built
    once or more per batch)."""
    if hasattr(cls, "__post_init__"):
        raise TypeError(f"{cls.__name__}: a wire message checks its fields when decoded, not in __post_init__")
    env: dict[str, Any] = {"_NO_VALUE": _NO_VALUE}
    params, body = [], []
    for i, f in enumerate(fields):
        if not f.init:
            raise TypeError(f"{cls.__name__}.{f.name}: every field of a wire message is set by its constructor")
        env[f"_set{i}"] = getattr(cls, f.name).__set__
        if f.default is not dataclasses.MISSING:
            env[f"_default{i}"] = f.default
            params.append(f"{f.name}=_default{i}")
        elif f.default_factory is not dataclasses.MISSING:
            env[f"_factory{i}"] = f.default_factory
            params.append(f"{f.name}=_NO_VALUE")
            body.append(f"    if {f.name} is _NO_VALUE: {f.name} = _factory{i}()")
        else:
            params.append(f.name)
        body.append(f"    _set{i}(self, {f.name})")
    signature = f"self, *, {', '.join(params)}" if params else "self"
    exec(f"def __init__({signature}):\n" + "\n".join(body or ["    pass"]), env)
    init = env["__init__"]
    init.__qualname__ = f"{cls.__qualname__}.__init__"
    init.__module__ = cls.__module__
    cls.__init__ = init


class Protocol:
    """One boundary's tag table: `encode(msg) -> bytes`, `decode(bytes) -> msg`."""

    def __init__(self, name: str, version: int, messages: Iterable[type[Message]], *,
                 ignore_newer_fields: bool = False) -> None:
        self.name = name
        self.version = version
        # Only between authenticated members of one cluster: input from clients keeps
        # the strict count, so a malformed frame is named rather than half-read.
        self.ignore_newer_fields = ignore_newer_fields
        self._by_tag: dict[int, type[Message]] = {}
        for cls in messages:
            if cls.TAG <= 0:
                raise TypeError(f"{cls.__name__} has no TAG")
            if cls.TAG in self._by_tag:
                raise TypeError(
                    f"{name}: tag {cls.TAG} used by {self._by_tag[cls.TAG].__name__} and {cls.__name__}"
                )
            self._by_tag[cls.TAG] = cls

    def message_types(self) -> list[type[Message]]:
        return [self._by_tag[tag] for tag in sorted(self._by_tag)]

    def encode(self, msg: Message) -> bytes:
        assert type(msg).TAG in self._by_tag, f"{type(msg).__name__} is not in {self.name}"
        return _PACKERS.pack(msg.to_wire())

    def decode(self, frame: bytes) -> Message:
        """Decode one frame; any fault is an `InvalidArgument` with a clear message."""
        items = unpack(frame)
        if type(items) is not list or not items:
            raise InvalidArgument("malformed frame: expected a non-empty msgpack array [tag, fields...]")
        tag = items[0]
        if type(tag) is not int:
            raise InvalidArgument(f"malformed frame: the first element must be an integer tag, got {_shown(tag)}")
        cls = self._by_tag.get(tag)
        if cls is None:
            raise InvalidArgument(f"unknown message tag {tag} for the {self.name} protocol")
        if self.ignore_newer_fields:
            return _build(cls, items[1:1 + len(cls._fields)], cls.__name__)
        return _build(cls, items[1:], cls.__name__)


class _Packers(threading.local):
    """One msgpack `Packer` per thread, kept: `packb` builds one per call (half of a
    small message's encode), and a Packer's buffer is not safe across threads."""

    def __init__(self) -> None:
        self.pack = msgpack.Packer(use_bin_type=True).pack


_PACKERS = _Packers()


def unpack(frame: bytes) -> Any:
    """msgpack-decode one frame with explicit caps and no extension types."""
    try:
        if len(frame) <= _MAP_LEN_MAX:
            # Every cap below is then len(frame), which is what msgpack sets by itself
            # when not told (and raw=False, use_list, strict_map_key are its defaults):
            # a third of the call's cost, most frames.
            return msgpack.unpackb(frame, max_ext_len=0)
        return msgpack.unpackb(
            frame,
            raw=False,
            use_list=True,
            strict_map_key=True,
            max_bin_len=len(frame),
            max_str_len=min(len(frame), _STR_LEN_MAX),
            max_array_len=min(len(frame), _ARRAY_LEN_MAX),
            max_map_len=min(len(frame), _MAP_LEN_MAX),
            max_ext_len=0,
        )
    except UnicodeDecodeError:
        raise InvalidArgument("malformed frame: a string is not valid UTF-8") from None
    except (ValueError, TypeError, msgpack.ExtraData, msgpack.FormatError, msgpack.StackError) as exc:
        raise InvalidArgument(f"malformed frame: not a valid msgpack value ({type(exc).__name__})") from None


_ARRAY_HEADER_BYTES = {0xDC: 3, 0xDD: 5}  # array 16, array 32
_UINTS = {0xCC: struct.Struct(">B"), 0xCD: struct.Struct(">H"), 0xCE: struct.Struct(">I"), 0xCF: struct.Struct(">Q")}


def peek_ints(frame: bytes | memoryview, tag: int, count: int) -> tuple[int, ...] | None:
    """The first `count` fields of a frame with message tag `tag`, when they are
    non-negative integers, read from the frame's first bytes without decoding the rest
    (a gateway routes a batch by its ids and leaves the decoding to the actor that
    owns it). None when the frame is another message or not in that shape: decode it
    to learn more."""
    try:
        first = frame[0]
        if 0x90 <= first <= 0x9F:
            if first - 0x90 < count + 1:
                return None
            pos = 1
        elif first in _ARRAY_HEADER_BYTES:
            pos = _ARRAY_HEADER_BYTES[first]
        else:
            return None
        if frame[pos] != tag or tag > 0x7F:
            return None
        pos += 1
        ints = []
        for _ in range(count):
            marker = frame[pos]
            if marker <= 0x7F:
                ints.append(marker)
                pos += 1
            else:
                unpacker = _UINTS.get(marker)
                if unpacker is None:
                    return None
                ints.append(unpacker.unpack_from(frame, pos + 1)[0])
                pos += 1 + unpacker.size
        return tuple(ints)
    except (IndexError, struct.error):
        return None


def peek_request_id(frame: bytes | memoryview) -> int:
    """Best effort: the request id (a message's first field) of a frame that failed to
    decode, so the client can match the error to its request (0 when it cannot be read)."""
    try:
        unpacker = msgpack.Unpacker(raw=False, max_buffer_size=max(len(frame), 1))
        unpacker.feed(frame)
        if unpacker.read_array_header() < 2:
            return 0
        unpacker.skip()
        request_id = unpacker.unpack()
    except Exception:
        return 0
    return request_id if type(request_id) is int and request_id >= 0 else 0
