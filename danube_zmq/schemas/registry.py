"""The schema registry: subjects, versions, ids and compatibility, kept in the metadata
store (`consensus.metadata_store.MetadataStore`: the broker's Raft store, one voter when
standalone), so every broker of a cluster sees the same registry.

Model (Danube's, with Confluent's transitive modes added):

- A subject holds versions 1, 2, ... of one schema type. The subject gets one schema id
  when it is created, from a global monotonic counter; `(schema_id, version)` names one
  version, and messages carry both.
- Registering a definition whose fingerprint (SHA-256 of the normalized definition)
  equals a live version's returns that version (`is_new` False).
- A new version must be compatible under the subject's mode (default BACKWARD) with the
  latest live version (BACKWARD, FORWARD, FULL) or with every live version
  (`*_TRANSITIVE`); otherwise `IncompatibleSchema` lists the reasons. NONE checks
  nothing. The schema type of a subject never changes.
- Deleting a version is soft: it stops being "latest" and is skipped by compatibility
  checks and fingerprint reuse, but stays readable by id and version, because messages
  written with it may still be in topics.

Keys:

    /schemas/subjects/{subject}                  msgpack: id, type, mode, versions
                                                 [[version, fingerprint, deleted, created_ms, description]]
    /schemas/subjects/{subject}/versions/{v:010d}  the normalized definition
    /schemas/ids/{schema_id:020d}                the subject's name
    counter /schemas/next_id

A definition is checked against `SchemaLimits` (its size before anything parses it, then
its node count and depth) and then compiled, normalized and compared with the subject's
versions in a worker thread of the registry's own, one at a time: a large schema's
compile no longer holds the event loop for its whole length.

A registration writes the subject record and the new version's definition in one
transaction guarded by the record's version, so concurrent registrations on any brokers
never interleave (the loser re-reads and retries).
"""

from __future__ import annotations

import asyncio
import hashlib
import re
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import msgpack

from danube_zmq.consensus.metadata_store import MetadataStore
from danube_zmq.schemas.formats import format_for
from danube_zmq.schemas.limits import SchemaLimits, check_definition
from danube_zmq.schemas.types import CompatibilityMode, SchemaType
from danube_zmq.storage.paths import show
from danube_zmq.transport.errors import FailedPrecondition, InvalidArgument, NotFound, Unavailable

__all__ = [
    "IncompatibleSchema",
    "Registered",
    "SchemaRegistry",
    "SchemaVersion",
    "SubjectSummary",
    "VersionInfo",
    "compatibility_errors",
]

# Not starting with '.': a subject is a metadata key segment, and never `.` or `..`.
_SUBJECT = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9._-]{0,254}")
_SUBJECTS = "/schemas/subjects/"
_IDS = "/schemas/ids/"
_NEXT_ID = "/schemas/next_id"
_RETRIES_MAX = 16  # concurrent registrations on one subject; each retry re-reads


class IncompatibleSchema(FailedPrecondition):
    """A schema not compatible with its subject under the subject's mode; `reasons` lists why."""

    def __init__(self, message: str, reasons: list[str]) -> None:
        super().__init__(message)
        self.reasons = reasons


@dataclass(frozen=True, slots=True)
class Registered:
    schema_id: int
    version: int
    is_new: bool
    fingerprint: str


@dataclass(frozen=True, slots=True)
class VersionInfo:
    version: int
    fingerprint: str
    deleted: bool
    created_ms: int
    description: str


@dataclass(frozen=True, slots=True)
class SchemaVersion:
    subject: str
    schema_id: int
    version: int
    schema_type: SchemaType
    definition: bytes  # normalized
    fingerprint: str
    compatibility: CompatibilityMode
    deleted: bool
    created_ms: int
    description: str


@dataclass(frozen=True, slots=True)
class SubjectSummary:
    subject: str
    schema_id: int
    schema_type: SchemaType
    latest_version: int | None  # None: every version deleted
    compatibility: CompatibilityMode


@dataclass(slots=True)
class _Subject:
    schema_id: int
    schema_type: SchemaType
    mode: CompatibilityMode
    versions: list[VersionInfo]

    def encode(self) -> bytes:
        return msgpack.packb({
            "id": self.schema_id, "type": self.schema_type.value, "mode": self.mode.value,
            "versions": [[v.version, v.fingerprint, v.deleted, v.created_ms, v.description] for v in self.versions],
        })

    @staticmethod
    def decode(data: bytes) -> _Subject:
        raw = msgpack.unpackb(data)
        return _Subject(
            schema_id=raw["id"], schema_type=SchemaType(raw["type"]), mode=CompatibilityMode(raw["mode"]),
            versions=[VersionInfo(version=v[0], fingerprint=v[1], deleted=v[2], created_ms=v[3], description=v[4])
                      for v in raw["versions"]],
        )

    def live(self) -> list[VersionInfo]:
        return [v for v in self.versions if not v.deleted]


def check_subject(subject: str) -> str:
    if not isinstance(subject, str) or not _SUBJECT.fullmatch(subject):
        raise InvalidArgument(f"invalid subject {show(subject)}: 1..255 of A-Z a-z 0-9 . _ -, not starting with '.'")
    return subject


def _subject_key(subject: str) -> str:
    return _SUBJECTS + subject


def _version_key(subject: str, version: int) -> str:
    return f"{_SUBJECTS}{subject}/versions/{version:010d}"


def compatibility_errors(
    schema_type: SchemaType, mode: CompatibilityMode, new: bytes, existing: list[bytes]
) -> list[str]:
    """Why `new` may not follow `existing` (oldest first) under `mode`; empty if it may."""
    if mode is CompatibilityMode.NONE or not existing:
        return []
    fmt = format_for(schema_type)
    transitive = mode.value.endswith("_transitive")
    against = existing if transitive else existing[-1:]
    backward = mode in (CompatibilityMode.BACKWARD, CompatibilityMode.BACKWARD_TRANSITIVE, CompatibilityMode.FULL,
                        CompatibilityMode.FULL_TRANSITIVE)
    forward = mode in (CompatibilityMode.FORWARD, CompatibilityMode.FORWARD_TRANSITIVE, CompatibilityMode.FULL,
                       CompatibilityMode.FULL_TRANSITIVE)
    evolution = getattr(fmt, "evolution_errors", None)
    reasons: list[str] = []
    for index, old in enumerate(against):
        label = f"version {len(existing) - len(against) + index + 1}" if transitive else "the latest version"
        if evolution is not None:
            reasons += [f"from {label}: {r}" for r in evolution(old, new)]
        if backward:
            reasons += [f"backward (new reads data of {label}): {r}" for r in fmt.reader_errors(new, old)]
        if forward:
            reasons += [f"forward ({label} reads new data): {r}" for r in fmt.reader_errors(old, new)]
    return reasons


class SchemaRegistry:
    """The registry over a `MetadataStore`; every method is one or a few store rounds."""

    def __init__(self, store: MetadataStore, *, default_mode: CompatibilityMode = CompatibilityMode.BACKWARD,
                 limits: SchemaLimits | None = None) -> None:
        self.store = store
        self.default_mode = default_mode
        self.limits = limits or SchemaLimits()
        # One compile at a time: concurrent registrations of large schemas queue here
        # instead of multiplying the memory and CPU they take.
        self._compiler = ThreadPoolExecutor(max_workers=1, thread_name_prefix="schema-compile")

    async def _off_loop(self, work: object, *args: object) -> object:
        return await asyncio.get_running_loop().run_in_executor(self._compiler, work, *args)  # type: ignore[arg-type]

    async def _normalize(self, schema_type: SchemaType, definition: bytes) -> bytes:
        """The normalized definition, once it passed the limits (checked on the loop: cheap)."""
        check_definition(schema_type, definition, self.limits)
        return await self._off_loop(format_for(schema_type).normalize, definition)  # type: ignore[return-value]

    async def _compatibility(self, schema_type: SchemaType, mode: CompatibilityMode, new: bytes,
                             existing: list[bytes]) -> list[str]:
        return await self._off_loop(compatibility_errors, schema_type, mode, new, existing)  # type: ignore[return-value]

    # ------------------------------------------------------------------ reads

    async def _subject(self, subject: str) -> tuple[_Subject, int]:
        value = await self.store.get(_subject_key(check_subject(subject)))
        if value is None:
            raise NotFound(f"schema subject {subject!r} not found")
        return _Subject.decode(value.value), value.version

    async def _definition(self, subject: str, version: int) -> bytes:
        value = await self.store.get(_version_key(subject, version))
        if value is None:  # the record names it, so the store lost it: not the caller's fault
            raise Unavailable(f"schema {subject!r} version {version} is listed but its definition is missing")
        return value.value

    def _version_of(self, subject: str, record: _Subject, version: int) -> VersionInfo:
        for info in record.versions:
            if info.version == version:
                return info
        raise NotFound(f"schema subject {subject!r} has no version {version}")

    async def _load(self, subject: str, record: _Subject, info: VersionInfo) -> SchemaVersion:
        return SchemaVersion(
            subject=subject, schema_id=record.schema_id, version=info.version, schema_type=record.schema_type,
            definition=await self._definition(subject, info.version), fingerprint=info.fingerprint,
            compatibility=record.mode, deleted=info.deleted, created_ms=info.created_ms, description=info.description,
        )

    async def get_version(self, subject: str, version: int) -> SchemaVersion:
        record, _ = await self._subject(subject)
        return await self._load(subject, record, self._version_of(subject, record, version))

    async def get_latest(self, subject: str) -> SchemaVersion:
        record, _ = await self._subject(subject)
        live = record.live()
        if not live:
            raise NotFound(f"schema subject {subject!r} has no live version (all deleted)")
        return await self._load(subject, record, live[-1])

    async def subject_of(self, schema_id: int) -> str:
        value = await self.store.get(f"{_IDS}{schema_id:020d}")
        if value is None:
            raise NotFound(f"schema id {schema_id} not found")
        return value.value.decode()

    async def get_by_id(self, schema_id: int, version: int | None = None) -> SchemaVersion:
        """The subject's version `version` (latest live one if None) of `schema_id`."""
        subject = await self.subject_of(schema_id)
        record, _ = await self._subject(subject)
        if record.schema_id != schema_id:
            raise NotFound(f"schema id {schema_id} not found")
        if version is None:
            return await self.get_latest(subject)
        return await self._load(subject, record, self._version_of(subject, record, version))

    async def resolve(self, subject: str, *, pinned: int | None = None, min_version: int | None = None) -> SchemaVersion:
        """What a producer uses: a pinned version, the latest if at least `min_version`, or the latest."""
        if pinned is not None and min_version is not None:
            raise InvalidArgument("pin a schema version or ask for a minimum one, not both")
        if pinned is not None:
            found = await self.get_version(subject, pinned)
            if found.deleted:
                raise NotFound(f"schema subject {subject!r} version {pinned} is deleted")
            return found
        latest = await self.get_latest(subject)
        if min_version is not None and latest.version < min_version:
            raise NotFound(f"schema subject {subject!r} has no version >= {min_version} (latest {latest.version})")
        return latest

    async def versions(self, subject: str) -> list[VersionInfo]:
        record, _ = await self._subject(subject)
        return list(record.versions)

    async def summary(self, subject: str) -> SubjectSummary:
        record, _ = await self._subject(subject)
        return _summary(subject, record)

    async def list_subjects(self) -> list[SubjectSummary]:
        out = []
        for key, value in await self.store.list_prefix(_SUBJECTS):
            name = key[len(_SUBJECTS):]
            if "/" in name:
                continue  # a version's definition
            out.append(_summary(name, _Subject.decode(value.value)))
        return out

    async def get_compatibility(self, subject: str) -> CompatibilityMode:
        record, _ = await self._subject(subject)
        return record.mode

    # ------------------------------------------------------------------ checks

    async def check(
        self, subject: str, schema_type: SchemaType, definition: bytes, mode: CompatibilityMode | None = None
    ) -> list[str]:
        """Why `definition` could not be registered under `subject` (empty: it could).
        `mode` overrides the subject's mode for this check only."""
        normalized = await self._normalize(schema_type, definition)
        try:
            record, _ = await self._subject(subject)
        except NotFound:
            return []
        if record.schema_type is not schema_type:
            return [f"subject {subject!r} holds {record.schema_type.value} schemas, not {schema_type.value}"]
        existing = [await self._definition(subject, v.version) for v in record.live()]
        return await self._compatibility(schema_type, mode or record.mode, normalized, existing)

    # ------------------------------------------------------------------ writes

    async def register(
        self, subject: str, schema_type: SchemaType, definition: bytes, *, description: str = ""
    ) -> Registered:
        check_subject(subject)
        normalized = await self._normalize(schema_type, definition)
        fingerprint = hashlib.sha256(normalized).hexdigest()
        for _attempt in range(_RETRIES_MAX):
            value = await self.store.get(_subject_key(subject))
            if value is None:
                result = await self._create(subject, schema_type, normalized, fingerprint, description)
            else:
                result = await self._add_version(subject, _Subject.decode(value.value), value.version, schema_type,
                                                 normalized, fingerprint, description)
            if result is not None:
                return result
        raise Unavailable(f"schema subject {subject!r} kept changing during registration; retry")

    async def _create(
        self, subject: str, schema_type: SchemaType, normalized: bytes, fingerprint: str, description: str
    ) -> Registered | None:
        schema_id = await self.store.allocate_id(_NEXT_ID)
        info = VersionInfo(version=1, fingerprint=fingerprint, deleted=False, created_ms=_now_ms(),
                           description=description)
        record = _Subject(schema_id=schema_id, schema_type=schema_type, mode=self.default_mode, versions=[info])
        ok = await self.store.transaction(
            {_subject_key(subject): 0},
            {_subject_key(subject): record.encode(), _version_key(subject, 1): normalized,
             f"{_IDS}{schema_id:020d}": subject.encode()},
        )
        return Registered(schema_id, 1, True, fingerprint) if ok else None  # an id lost to a race is skipped

    async def _add_version(
        self, subject: str, record: _Subject, record_version: int, schema_type: SchemaType, normalized: bytes,
        fingerprint: str, description: str,
    ) -> Registered | None:
        if record.schema_type is not schema_type:
            raise FailedPrecondition(
                f"subject {subject!r} holds {record.schema_type.value} schemas; it cannot take a {schema_type.value} one"
            )
        live = record.live()
        for info in live:
            if info.fingerprint == fingerprint:
                return Registered(record.schema_id, info.version, False, fingerprint)
        existing = [await self._definition(subject, v.version) for v in live]
        reasons = await self._compatibility(schema_type, record.mode, normalized, existing)
        if reasons:
            raise IncompatibleSchema(
                f"schema is not compatible with subject {subject!r} (mode {record.mode.value}): " + "; ".join(reasons),
                reasons,
            )
        version = max(v.version for v in record.versions) + 1
        record.versions.append(VersionInfo(version=version, fingerprint=fingerprint, deleted=False,
                                           created_ms=_now_ms(), description=description))
        ok = await self.store.transaction(
            {_subject_key(subject): record_version, _version_key(subject, version): 0},
            {_subject_key(subject): record.encode(), _version_key(subject, version): normalized},
        )
        return Registered(record.schema_id, version, True, fingerprint) if ok else None

    async def _update(self, subject: str, change: object) -> _Subject:
        """Apply `change(record)` under the record's version, retrying on a race."""
        for _attempt in range(_RETRIES_MAX):
            record, version = await self._subject(subject)
            change(record)  # type: ignore[operator]
            if await self.store.transaction({_subject_key(subject): version}, {_subject_key(subject): record.encode()}):
                return record
        raise Unavailable(f"schema subject {subject!r} kept changing; retry")

    async def set_compatibility(self, subject: str, mode: CompatibilityMode) -> None:
        def change(record: _Subject) -> None:
            record.mode = mode

        await self._update(subject, change)

    async def delete_version(self, subject: str, version: int) -> None:
        """Soft-delete `version`: no longer latest nor checked against; still readable."""

        def change(record: _Subject) -> None:
            info = self._version_of(subject, record, version)
            if info.deleted:
                raise NotFound(f"schema subject {subject!r} version {version} is already deleted")
            record.versions = [
                VersionInfo(version=v.version, fingerprint=v.fingerprint, deleted=True, created_ms=v.created_ms,
                            description=v.description) if v.version == version else v
                for v in record.versions
            ]

        await self._update(subject, change)


def _summary(subject: str, record: _Subject) -> SubjectSummary:
    live = record.live()
    return SubjectSummary(subject=subject, schema_id=record.schema_id, schema_type=record.schema_type,
                          latest_version=live[-1].version if live else None, compatibility=record.mode)


def _now_ms() -> int:
    return int(time.time() * 1000)
