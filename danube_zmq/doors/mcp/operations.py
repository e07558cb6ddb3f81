"""MCP tools made from the admin operations' declaration (transport/admin_operations.py):
one tool per operation in `TOOLS`, named as the operation, described by its help, with
its parameters' types, defaults, values and help as the input schema, and marked read
or write (destructive, idempotent) as declared. A call sends the operation's request
on an admin connection with the caller's credentials and answers the parameters given
and the reply's fields as JSON data.

The tools `mcp_server.py` writes by hand compose several operations (health_check,
analyze_consumer_lag, get_namespace_policies...) or do more than one request
(set_failure_policy keeps the fields left out).
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable
from typing import Annotated, Any, Literal

from mcp.server.mcpserver import Context
from pydantic import Field

from danube_zmq.client.admin import AdminClient
from danube_zmq.client.json_records import jsonable
from danube_zmq.transport.admin_operations import Operation
from danube_zmq.transport.client_protocol import DispatchStrategy

__all__ = ["DEFAULTS", "TOOLS", "tool_of"]

# The operations offered as tools of their own.
TOOLS: tuple[str, ...] = (
    "cluster_status", "list_brokers", "get_cluster_balance", "list_namespaces", "list_subscriptions",
    "list_roles", "list_bindings", "list_client_keys", "list_revoked_tokens",
    "create_namespace", "delete_namespace", "create_topic", "delete_topic", "unload_topic", "compact_topic",
    "unsubscribe",
    "seek_subscription", "set_dispatch_config", "set_namespace_limits", "set_backlog_quota",
    "configure_topic_schema", "rebalance_cluster", "unload_broker", "activate_broker",
    "create_role", "delete_role", "create_binding", "delete_binding",
)
# Defaults that differ for an agent: a rebalance only plans unless asked to move.
DEFAULTS: dict[tuple[str, str], Any] = {("rebalance_cluster", "dry_run"): True,
                                         ("create_binding", "principal_type"): "user"}
_ENUMS = {"dispatch_strategy": DispatchStrategy}
# Reply fields named more plainly for an agent than on the wire.
_RENAMED = {("list_client_keys", "keys"): "client_keys", ("list_revoked_tokens", "tokens"): "revoked_tokens"}

Admin = Callable[[Context, Callable[[AdminClient], Awaitable[Any]]], Awaitable[Any]]


def tool_of(op: Operation, admin: Admin) -> Callable[..., Awaitable[dict[str, Any]]]:
    """The tool function of `op`; `admin(ctx, call)` runs `call` on a connection with
    the caller's credentials and turns a refusal into the tool's error."""
    params, annotations = [], {}
    for param in op.params:
        kind: Any = param.type
        choices = op.choices(param.name)
        if choices is not None:
            kind = Literal[choices] | None if param.default is None and not param.required else Literal[choices]  # type: ignore[valid-type]
        annotation = Annotated[kind, Field(description=param.help)]
        default = DEFAULTS.get((op.name, param.name), inspect.Parameter.empty if param.required else param.default)
        if param.name in _ENUMS and default is not inspect.Parameter.empty and default is not None:
            default = _ENUMS[param.name](default).name.lower()
        params.append(inspect.Parameter(param.name, inspect.Parameter.KEYWORD_ONLY, annotation=annotation,
                                        default=default))
        annotations[param.name] = annotation
    params.append(inspect.Parameter("ctx", inspect.Parameter.KEYWORD_ONLY, annotation=Context))
    annotations["ctx"] = Context

    async def tool(ctx: Context, **given: Any) -> dict[str, Any]:
        values = {name: _wire(name, value) for name, value in given.items()}
        if isinstance(values.get("namespace"), str):
            values["namespace"] = _namespace(values["namespace"])
        answer = await admin(ctx, lambda client: client.perform(op.request, **values))
        reply = {_RENAMED.get((op.name, key), key): value for key, value in (jsonable(answer) or {}).items()}
        return {**jsonable(given), **reply}

    tool.__name__ = tool.__qualname__ = op.name
    tool.__signature__ = inspect.Signature(params, return_annotation=dict[str, Any])  # type: ignore[attr-defined]
    tool.__annotations__ = {**annotations, "return": dict[str, Any]}
    return tool


def _wire(name: str, value: Any) -> Any:
    if name in _ENUMS and isinstance(value, str):
        return _ENUMS[name][value.upper()].value
    return value


def _namespace(name: str) -> str:
    """`/orders` as `orders`: a namespace as a topic's first part names it."""
    return name[1:] if name.startswith("/") and name.count("/") == 1 else name
