"""The admin operations' declaration (transport/admin_operations.py) against everything
built from it or checked by it: every admin request is declared once with help for each
parameter; the permission table's admin rows are the declaration's; the MCP tools made
from it take its parameters and are marked as it says; and every operation has a
`danube admin` (or `danube security`) command that takes each of its parameters, so
none is missing from the CLI and none drifts."""

from __future__ import annotations

import asyncio

import click
import pytest

from danube_zmq.cli.main import cli
from danube_zmq.doors.mcp.operations import DEFAULTS, TOOLS
from danube_zmq.doors.mcp.server import WRITE_TOOLS, McpSettings, build_server
from danube_zmq.security.requirements import REQUIREMENTS, FirstOf
from danube_zmq.transport import admin_protocol as ap
from danube_zmq.transport.admin_operations import OPERATIONS, by_name, by_request

# Each operation's commands (several when the namespace and the topic have one each),
# and the options named otherwise than the request's fields.
CLI: dict[str, tuple[tuple[str, ...], dict[str, str]]] = {
    "list_namespaces": (("admin namespaces list",), {}),
    "create_namespace": (("admin namespaces create",), {}),
    "delete_namespace": (("admin namespaces delete",), {}),
    "set_namespace_limits": (("admin namespaces set-limits",), {}),
    "get_namespace_limits": (("admin namespaces get-limits",), {}),
    "remove_namespace_limits": (("admin namespaces remove-limits",), {}),
    "set_auto_topic_creation": (("admin namespaces policies set",), {}),
    "get_auto_topic_creation": (("admin namespaces policies get",), {}),
    "remove_auto_topic_creation": (("admin namespaces policies remove",), {}),
    "set_backlog_quota": (("admin namespaces set-backlog-quota", "admin topics set-backlog-quota"), {}),
    "get_backlog_quota": (("admin namespaces get-backlog-quota", "admin topics get-backlog-quota"), {}),
    "remove_backlog_quota": (("admin namespaces remove-backlog-quota", "admin topics remove-backlog-quota"), {}),
    "set_topic_policies": (("admin namespaces policies set", "admin topics policies set"), {}),
    "get_topic_policies": (("admin namespaces policies get", "admin topics policies get"), {}),
    "remove_topic_policies": (("admin namespaces policies remove", "admin topics policies remove"), {}),
    "list_topics": (("admin topics list",), {}),
    "create_topic": (("admin topics create",), {}),
    "delete_topic": (("admin topics delete",), {}),
    "describe_topic": (("admin topics describe",), {}),
    "list_subscriptions": (("admin topics subscriptions",), {}),
    "unsubscribe": (("admin topics unsubscribe",), {}),
    "seek_subscription": (("admin topics seek",), {}),
    "set_failure_policy": (("admin topics set-failure-policy",), {}),
    "get_failure_policy": (("admin topics get-failure-policy",), {}),
    "set_dispatch_config": (("admin topics set-dispatch-config",), {}),
    "get_dispatch_config": (("admin topics get-dispatch-config",), {}),
    "unload_topic": (("admin topics unload",), {}),
    "compact_topic": (("admin topics compact",), {}),
    "repair_topic": (("admin topics repair",), {}),
    "reassign_topic": (("admin topics reassign",), {}),
    "configure_topic_schema": (("admin topics configure-schema",),
                               {"payload_validation": "enable_payload_validation"}),
    "get_topic_schema_config": (("admin topics get-schema-config",), {}),
    "list_brokers": (("admin brokers list",), {}),
    "get_cluster_balance": (("admin brokers balance",), {}),
    "rebalance_cluster": (("admin brokers rebalance",), {}),
    "unload_broker": (("admin brokers unload",), {}),
    "activate_broker": (("admin brokers activate",), {}),
    "cluster_status": (("admin cluster status",), {}),
    "add_cluster_node": (("admin cluster add-node",), {}),
    "promote_cluster_node": (("admin cluster promote-node",), {}),
    "remove_cluster_node": (("admin cluster remove-node",), {}),
    "metadata_get": (("admin metadata get",), {"linearizable": "stale"}),
    "metadata_list": (("admin metadata list",), {"linearizable": "stale"}),
    "metadata_put": (("admin metadata put",), {}),
    "metadata_compare_and_swap": (("admin metadata put",), {"expected_version": "expect_version"}),
    "metadata_delete": (("admin metadata delete",), {}),
    "create_snapshot": (("admin snapshots create",), {"topic": "pattern"}),
    "list_snapshots": (("admin snapshots list",), {}),
    "describe_snapshot": (("admin snapshots describe",), {}),
    "delete_snapshot": (("admin snapshots delete",), {}),
    "create_role": (("security roles create",), {}),
    "list_roles": (("security roles list",), {}),
    "delete_role": (("security roles delete",), {}),
    "create_binding": (("security bindings create",), {"roles": "role_names"}),
    "list_bindings": (("security bindings list",), {}),
    "delete_binding": (("security bindings delete",), {}),
    "revoke_token": (("security revocations add",), {"expires_at_ms": "expires_at"}),
    "list_revoked_tokens": (("security revocations list",), {}),
    "add_client_key": (("security client-keys add",), {}),
    "list_client_keys": (("security client-keys list",), {}),
    "remove_client_key": (("security client-keys remove",), {}),
}


def _commands() -> dict[str, set[str]]:
    """Every leaf command of `danube`, by its words, with its parameters' names."""
    ctx = click.Context(cli)
    found: dict[str, set[str]] = {}

    def walk(command: click.Command, path: list[str]) -> None:
        if isinstance(command, click.Group):
            for name in command.list_commands(ctx):
                sub = command.get_command(ctx, name)
                assert sub is not None
                walk(sub, [*path, name])
        else:
            found[" ".join(path)] = {p.name for p in command.params if p.name}

    walk(cli, [])
    return found


def test_every_admin_request_is_one_declared_operation_with_help_for_each_parameter() -> None:
    requests = {t for t in ap.ADMIN_REQUESTS + ap.CLUSTER_REQUESTS + ap.SNAPSHOT_REQUESTS + ap.SECURITY_REQUESTS
                if t not in ap.HANDOVER_REQUESTS}
    assert {op.request for op in OPERATIONS} == requests
    for op in OPERATIONS:
        assert by_request(op.request) is op and by_name(op.name) is op
        assert op.help.endswith(".") and op.help[0].isupper(), op.name
        for param in op.params:  # raises for a parameter with no help
            assert param.help, (op.name, param.name)
        assert op.writes or not (op.destructive or op.idempotent), f"{op.name}: a read is neither"


def test_the_permission_table_admin_rows_are_the_declarations() -> None:
    for op in OPERATIONS:
        requirement = REQUIREMENTS[op.request]
        assert requirement.permission == op.permission, op.name
        resource = requirement.resource
        kind = ("topic_or_namespace" if isinstance(resource, FirstOf)
                else getattr(resource, "name", "cluster"))
        assert kind == op.resource, op.name


@pytest.mark.parametrize("name", list(CLI))
def test_each_operation_has_a_command_taking_each_parameter(name: str) -> None:
    paths, renamed = CLI[name]
    commands = _commands()
    for path in paths:
        assert path in commands, f"{name}: no command `danube {path}`"
    for path in paths:
        # A namespace's command and a topic's each take the operation's parameters
        # but the other's name.
        other = {"admin namespaces": "topic", "admin topics": "namespace"}.get(" ".join(path.split()[:2])) \
            if len(paths) > 1 else None
        missing = [p.name for p in by_name(name).params
                   if p.name != other and renamed.get(p.name, p.name) not in commands[path]]
        assert not missing, f"`danube {path}` takes no {missing} ({name})"


def test_no_operation_is_left_out_of_the_cli_table() -> None:
    assert set(CLI) == {op.name for op in OPERATIONS}


def test_mcp_tools_made_from_the_declaration_take_its_parameters_and_marks() -> None:
    async def listed() -> dict:
        server = build_server(McpSettings(admin_endpoint="tcp://127.0.0.1:9", timeout_ms=100, allow_writes=True))
        return {tool.name: tool for tool in await server.list_tools()}

    tools = asyncio.run(listed())
    for name in TOOLS:
        op, tool = by_name(name), tools[name]
        schema = tool.input_schema
        assert list(schema["properties"]) == [p.name for p in op.params], name
        assert set(schema.get("required", ())) == {p.name for p in op.params
                                                   if p.required and (name, p.name) not in DEFAULTS}, name
        for param in op.params:
            assert schema["properties"][param.name]["description"] == param.help
        assert tool.annotations.read_only_hint is not op.writes, name
        if op.writes:
            assert name in WRITE_TOOLS and tool.annotations.destructive_hint is op.destructive, name
            assert tool.description.startswith("CHANGES THE CLUSTER")
        else:
            assert name not in WRITE_TOOLS and tool.description.startswith(op.help)


def test_console_actions_perform_declared_operations_and_offer_every_policy() -> None:
    """Each console action names operations that exist, and the policies form (made from
    TOPIC_POLICY_NAMES) offers every policy `set_topic_policies` takes."""
    from danube_zmq.config.broker_config import TOPIC_POLICY_NAMES
    from danube_zmq.doors.console.app import ACTIONS

    for path, operations in ACTIONS.items():
        for name in operations:
            assert by_name(name), (path, name)
    policies = {p.name for p in by_name("set_topic_policies").params} - {"namespace", "topic"}
    assert set(TOPIC_POLICY_NAMES) == policies
