"""`danube schemas`: the schema registry, over `SchemaRegistryClient` (client port).

As Danube's `danube-admin schemas`: register, get, versions, check, get-compatibility,
set-compatibility, delete, list-subjects. Definitions come from a file (`-f`) or inline
(`--schema`); `.proto` text and compiled descriptor sets (`protoc --include_imports
--descriptor_set_out`) are both accepted for protobuf.
"""

from __future__ import annotations

import asyncio
import base64
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

import click

from danube_zmq.cli.options import service_url_option
from danube_zmq.cli.output import emit_json, emit_line, emit_table
from danube_zmq.client.schemas import SchemaRegistryClient
from danube_zmq.schemas.types import CompatibilityMode, SchemaType
from danube_zmq.transport import client_protocol as cp

__all__ = ["schemas"]

T = TypeVar("T")
_TYPES = click.Choice([t.value for t in SchemaType] + ["json", "proto"], case_sensitive=False)
_MODES = click.Choice([m.value for m in CompatibilityMode], case_sensitive=False)
_OUTPUT = click.option("-o", "--output", type=click.Choice(["table", "json"]), default="table", show_default=True,
                       help="Table for people, one JSON document for programs.")


def _run(service_url: str, operation: Callable[[SchemaRegistryClient], Awaitable[T]]) -> T:
    async def run() -> T:
        async with SchemaRegistryClient(service_url) as client:
            return await operation(client)

    return asyncio.run(run())


def _definition(file: Path | None, inline: str | None) -> bytes:
    if (file is None) == (inline is None):
        raise click.UsageError("give the schema with exactly one of -f/--file or --schema")
    if file is not None:
        try:
            return file.read_bytes()
        except OSError as exc:
            raise click.BadParameter(f"cannot read {file}: {exc.strerror}", param_hint="-f/--file") from None
    assert inline is not None
    return inline.encode()


def _when(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S")


def _shown(definition: bytes) -> str:
    try:
        return definition.decode("utf-8")
    except UnicodeDecodeError:
        return "base64:" + base64.b64encode(definition).decode()


@click.group()
def schemas() -> None:
    """Register, inspect and evolve schemas (subjects, versions, compatibility).

    \b
    Examples:
      danube schemas register orders --schema-type json_schema -f orders.schema.json
      danube schemas check orders --schema-type json_schema -f orders-v2.schema.json
      danube schemas get --subject orders
      danube schemas set-compatibility orders --mode full_transitive
    """


_file = click.option("-f", "--file", "file", type=click.Path(path_type=Path, dir_okay=False), default=None,
                     help="Read the schema definition from this file.")
_inline = click.option("--schema", "inline", default=None, help="The schema definition, inline.")
_type = click.option("-t", "--schema-type", "schema_type", type=_TYPES, required=True, help="The schema type.")


@schemas.command("register")
@click.argument("subject")
@_type
@_file
@_inline
@click.option("--description", default="", help="Stored with the version.")
@service_url_option
@_OUTPUT
def register(subject: str, schema_type: str, file: Path | None, inline: str | None, description: str,
             service_url: str, output: str) -> None:
    """Register a schema under SUBJECT (an identical one returns its existing version)."""
    definition = _definition(file, inline)
    done = _run(service_url, lambda c: c.register(subject, schema_type, definition, description=description))
    if output == "json":
        emit_json({"subject": subject, "schema_id": done.schema_id, "version": done.version, "is_new": done.is_new,
                   "fingerprint": done.fingerprint})
        return
    state = "registered" if done.is_new else "already registered"
    emit_line(f"{subject}: {state} as version {done.version} (schema id {done.schema_id})")


@schemas.command("get")
@click.option("--id", "schema_id", type=click.IntRange(min=1), default=None, help="By schema id.")
@click.option("--subject", default=None, help="By subject.")
@click.option("--version", type=click.IntRange(min=1), default=None, help="This version (default: the latest).")
@service_url_option
@_OUTPUT
def get(schema_id: int | None, subject: str | None, version: int | None, service_url: str, output: str) -> None:
    """Show one schema version, by --id or by --subject."""
    if (schema_id is None) == (subject is None):
        raise click.UsageError("give exactly one of --id or --subject")
    info: cp.SchemaInfo = _run(service_url, lambda c: c.get_schema(schema_id=schema_id, subject=subject,
                                                                   version=version))
    if output == "json":
        emit_json({"subject": info.subject, "schema_id": info.schema_id, "version": info.version,
                   "schema_type": info.schema_type, "compatibility": info.compatibility, "deleted": info.deleted,
                   "fingerprint": info.fingerprint, "created": _when(info.created_ms),
                   "description": info.description, "definition": _shown(info.definition)})
        return
    emit_table(["SUBJECT", "SCHEMA-ID", "VERSION", "TYPE", "COMPATIBILITY", "DELETED", "CREATED"],
               [[info.subject, info.schema_id, info.version, info.schema_type, info.compatibility,
                 "yes" if info.deleted else "no", _when(info.created_ms)]])
    emit_line(_shown(info.definition))


@schemas.command("versions")
@click.argument("subject")
@service_url_option
@_OUTPUT
def versions(subject: str, service_url: str, output: str) -> None:
    """List SUBJECT's versions."""
    found: list[cp.SchemaVersionInfo] = _run(service_url, lambda c: c.versions(subject))
    rows: list[list[Any]] = [[v.version, v.fingerprint[:16], "yes" if v.deleted else "no", _when(v.created_ms),
                              v.description] for v in found]
    if output == "json":
        emit_json([{"version": v.version, "fingerprint": v.fingerprint, "deleted": v.deleted,
                    "created": _when(v.created_ms), "description": v.description} for v in found])
        return
    emit_table(["VERSION", "FINGERPRINT", "DELETED", "CREATED", "DESCRIPTION"], rows)


@schemas.command("check")
@click.argument("subject")
@_type
@_file
@_inline
@click.option("--mode", type=_MODES, default=None, help="Check under this mode instead of the subject's.")
@service_url_option
def check(subject: str, schema_type: str, file: Path | None, inline: str | None, mode: str | None,
          service_url: str) -> None:
    """Would this schema be accepted under SUBJECT? Exit 1 with the reasons if not."""
    definition = _definition(file, inline)
    result: cp.SchemaCheck = _run(service_url, lambda c: c.check(subject, schema_type, definition, mode=mode))
    if result.compatible:
        emit_line(f"compatible with {subject}")
        return
    for reason in result.reasons:
        click.echo(f"  {reason}", err=True)
    raise click.ClickException(f"not compatible with {subject} ({len(result.reasons)} reasons above)")


@schemas.command("get-compatibility")
@click.argument("subject")
@service_url_option
def get_compatibility(subject: str, service_url: str) -> None:
    """Show SUBJECT's compatibility mode."""
    emit_line(_run(service_url, lambda c: c.get_compatibility(subject)))


@schemas.command("set-compatibility")
@click.argument("subject")
@click.option("--mode", type=_MODES, required=True)
@service_url_option
def set_compatibility(subject: str, mode: str, service_url: str) -> None:
    """Set SUBJECT's compatibility mode."""
    emit_line(f"{subject}: compatibility {_run(service_url, lambda c: c.set_compatibility(subject, mode))}")


@schemas.command("delete")
@click.argument("subject")
@click.option("--version", type=click.IntRange(min=1), required=True)
@service_url_option
def delete(subject: str, version: int, service_url: str) -> None:
    """Soft-delete a version: no longer the latest, still readable by id and version."""
    _run(service_url, lambda c: c.delete_version(subject, version))
    emit_line(f"{subject}: version {version} deleted")


@schemas.command("list-subjects")
@service_url_option
@_OUTPUT
def list_subjects(service_url: str, output: str) -> None:
    """List every subject with its type, latest version and mode."""
    found: list[cp.SubjectInfo] = _run(service_url, lambda c: c.list_subjects())
    if output == "json":
        emit_json([{"subject": s.subject, "schema_id": s.schema_id, "schema_type": s.schema_type,
                    "latest_version": s.latest_version, "compatibility": s.compatibility} for s in found])
        return
    emit_table(["SUBJECT", "SCHEMA-ID", "TYPE", "LATEST-VERSION", "COMPATIBILITY"],
               [[s.subject, s.schema_id, s.schema_type, "-" if s.latest_version is None else s.latest_version,
                 s.compatibility] for s in found])
