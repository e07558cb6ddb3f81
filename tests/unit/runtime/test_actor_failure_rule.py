"""The runtime's one handler table and one failure rule, for tells, asks, and the
client and admin requests an actor receives wrapped in `ClientRequest`/`AdminRequest`.

A handler's return value is the answer; a raised `DanubeError` is an answer; anything
else is answered INTERNAL where someone waits and restarts the actor; an unknown
message is counted and answered with an error where someone waits, never a restart."""

from __future__ import annotations

import asyncio
import gc
import logging

import msgpack
import pytest
import zmq
import zmq.asyncio

from danube_zmq.actors.metrics import METRICS
from danube_zmq.clock import SystemClock
from danube_zmq.runtime import actor as actor_module
from danube_zmq.runtime.actor import ADMIN_OUTBOX, CLIENT_OUTBOX, Actor, Origin
from danube_zmq.runtime.request_tasks import RequestTasks
from danube_zmq.runtime.system import ActorSystem
from danube_zmq.transport import admin_protocol as ap
from danube_zmq.transport import client_protocol as cp
from danube_zmq.transport.common import Error, Ok
from danube_zmq.transport.errors import ErrorCode, InternalError, InvalidArgument, Moved, NotFound
from danube_zmq.transport.internal_protocol import (
    AdminRequest,
    ClientRequest,
    ClientRequests,
    ConsumerCount,
    DescribePartition,
    Done,
    ProducerSchema,
    SchemaVersionRef,
    SubscriptionEnded,
    Tick,
)

IDENTITY = b"conn-1"


class Worker(Actor):
    """Handles a few internal messages and client/admin requests, each in one way."""

    instances = 0
    seen: list[object] = []

    def __init__(self) -> None:
        Worker.instances += 1

    def handle_Tick(self, msg: Tick) -> None:
        Worker.seen.append("tick")

    def handle_ConsumerCount(self, msg: ConsumerCount) -> None:
        raise NotFound(f"no subscription {msg.subscription}")

    def handle_SubscriptionEnded(self, msg: SubscriptionEnded) -> Done:
        raise ValueError("a bug")

    def handle_DescribePartition(self, msg: DescribePartition) -> None:
        return None  # a handler for tells, asked by mistake

    async def handle_Lookup(self, msg: cp.Lookup, origin: Origin) -> cp.LookupResult:
        Worker.seen.append(origin)
        if msg.topic == "/ns/moved":
            raise Moved("served elsewhere", "tcp://other:1")
        if msg.topic == "/ns/bug":
            raise ValueError("a bug")
        return cp.LookupResult(request_id=msg.request_id, kind=cp.LookupKind.CONNECT, broker_url="tcp://here:1")

    def handle_Flow(self, msg: cp.Flow, origin: Origin) -> None:
        raise NotFound("no such consumer")  # a Flow has no request id: nobody to answer

    def handle_CreateProducer(self, msg: cp.CreateProducer, origin: Origin) -> None:
        Worker.seen.append(origin)  # answered later, by someone else

    def handle_ListNamespaces(self, msg: ap.ListNamespaces, origin: Origin) -> ap.NamespaceList:
        return ap.NamespaceList(request_id=msg.request_id, namespaces=["a"])

    def handle_CreateNamespace(self, msg: ap.CreateNamespace, origin: Origin) -> Ok:
        raise InvalidArgument(f"bad namespace {msg.namespace}")


class Host(Actor):
    """Asks its guest in place (the guest shares its mailbox)."""

    answers: list[object] = []

    def handle_Tick(self, msg: Tick) -> None:
        pass

    async def handle_Done(self, msg: Done) -> None:
        guest = self.system._cells[self.endpoint].children
        (endpoint,) = guest
        for asked in (DescribePartition(), SubscriptionEnded(subscription="s"), ConsumerCount(subscription="s", consumers=1),
                      Done()):
            try:
                Host.answers.append(await self.system.ask(endpoint, asked))
            except Exception as exc:
                Host.answers.append(exc)


@pytest.fixture
async def system():
    ctx = zmq.asyncio.Context()
    sys_ = ActorSystem(ctx, clock=SystemClock(), mailbox_messages_max=50, restarts_max=3, restart_window_ms=60_000)
    Worker.instances, Worker.seen, Host.answers = 0, [], []
    yield sys_
    await sys_.shutdown()
    ctx.term()


@pytest.fixture
def outboxes(system: ActorSystem):
    """The client and admin outboxes the gateways would bind, read by the test."""
    socks = {}
    for name, endpoint in (("client", CLIENT_OUTBOX), ("admin", ADMIN_OUTBOX)):
        sock = system._sync_context.socket(zmq.PULL)
        sock.setsockopt(zmq.LINGER, 0)
        sock.bind(endpoint)
        socks[name] = sock
    yield socks
    for sock in socks.values():
        sock.close(linger=0)


async def wait_for(predicate, timeout_s: float = 10.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not predicate():
        assert asyncio.get_running_loop().time() < deadline, "condition not reached in time"
        await asyncio.sleep(0.01)


async def answer_on(sock: zmq.Socket, protocol, timeout_s: float = 10.0):
    deadline = asyncio.get_running_loop().time() + timeout_s
    while True:
        try:
            identity, frame = sock.recv_multipart(zmq.NOBLOCK)
            return identity, protocol.decode(frame)
        except zmq.Again:
            assert asyncio.get_running_loop().time() < deadline, "no answer in time"
            await asyncio.sleep(0.01)


def stats(system: ActorSystem, name: str):
    return {s.name: s for s in system.actor_statistics()}[name]


def client(msg) -> ClientRequest:
    return ClientRequest(identity=IDENTITY, frame=cp.CLIENT_PROTOCOL.encode(msg))


def admin(msg) -> AdminRequest:
    return AdminRequest(identity=IDENTITY, frame=ap.ADMIN_PROTOCOL.encode(msg))


# ------------------------------------------------------------------ tells
async def test_a_tell_refused_with_a_danube_error_is_counted_and_does_not_restart(system: ActorSystem) -> None:
    """A told message whose handler raises a DanubeError is an answer nobody waits for:
    counted as refused, the actor keeps its state and its instance."""
    endpoint = await system.spawn(Worker, name="w")
    system.tell(endpoint, ConsumerCount(subscription="s", consumers=1))
    system.tell(endpoint, Tick())
    await wait_for(lambda: Worker.seen == ["tick"])
    assert stats(system, "w").refused_messages == 1
    assert Worker.instances == 1 and system.statistics().restarts == 0


async def test_a_tell_whose_handler_raises_anything_else_restarts_the_actor(system: ActorSystem) -> None:
    """A told message whose handler raises a non-DanubeError restarts the actor."""
    endpoint = await system.spawn(Worker, name="w")
    system.tell(endpoint, SubscriptionEnded(subscription="s"))
    system.tell(endpoint, Tick())
    await wait_for(lambda: Worker.seen == ["tick"])
    assert Worker.instances == 2 and system.statistics().restarts == 1
    assert stats(system, "w").failures == 1


# ------------------------------------------------------------------ asks
async def test_an_ask_failing_with_a_bug_is_answered_internal_and_restarts_the_actor(system: ActorSystem) -> None:
    """The asker of a handler that raises a non-DanubeError gets INTERNAL, and the actor restarts."""
    endpoint = await system.spawn(Worker, name="w")
    with pytest.raises(InternalError, match="ValueError: a bug"):
        await system.ask(endpoint, SubscriptionEnded(subscription="s"))
    await wait_for(lambda: Worker.instances == 2)
    assert system.statistics().restarts == 1 and system.is_alive(endpoint)


async def test_an_ask_without_a_handler_is_answered_with_an_error_naming_it(system: ActorSystem) -> None:
    """An ask the actor has no handler for gets INVALID_ARGUMENT naming the message:
    counted as unrecognized, never a restart."""
    endpoint = await system.spawn(Worker, name="w")
    with pytest.raises(InvalidArgument, match="w has no handler for Done"):
        await system.ask(endpoint, Done())
    assert stats(system, "w").unrecognized_messages == 1
    assert Worker.instances == 1 and system.statistics().restarts == 0


async def test_an_ask_answered_with_nothing_is_an_internal_error_not_a_restart(system: ActorSystem) -> None:
    """A handler that returns no message to an ask: the asker gets INTERNAL naming it;
    the handler itself ran to its end, so the actor keeps its state."""
    endpoint = await system.spawn(Worker, name="w")
    with pytest.raises(InternalError, match="answered DescribePartition with None"):
        await system.ask(endpoint, DescribePartition())
    assert Worker.instances == 1 and system.statistics().restarts == 0


async def test_an_ask_served_in_place_follows_the_same_rule(system: ActorSystem) -> None:
    """Inside a group (an ask served in place by the one task): nothing answers INTERNAL,
    a bug answers INTERNAL and restarts the guest alone, a DanubeError is the answer, an
    unknown ask is answered with an error."""
    host = await system.spawn(Host, name="host")
    await system.spawn(Worker, name="guest", parent=host, share_mailbox=True)
    system.tell(host, Done())
    await wait_for(lambda: len(Host.answers) == 4)
    nothing, bug, refused, unknown = Host.answers
    assert isinstance(nothing, InternalError) and "with None" in str(nothing)
    assert isinstance(bug, InternalError) and "ValueError: a bug" in str(bug)
    assert isinstance(refused, NotFound)
    assert isinstance(unknown, InvalidArgument) and "guest has no handler for Done" in str(unknown)
    assert Worker.instances == 2 and system.is_alive(host)


# ------------------------------------------------------------------ client and admin requests
async def test_a_client_request_reaches_its_handler_with_its_origin_and_is_answered(
        system: ActorSystem, outboxes) -> None:
    """A `ClientRequest` is unwrapped by the runtime: `handle_Lookup(msg, origin)` runs,
    and the message it returns goes to the client's connection."""
    endpoint = await system.spawn(Worker, name="w")
    system.tell(endpoint, client(cp.Lookup(request_id=7, topic="/ns/t")))
    identity, answer = await answer_on(outboxes["client"], cp.CLIENT_PROTOCOL)
    assert identity == IDENTITY
    assert answer == cp.LookupResult(request_id=7, kind=cp.LookupKind.CONNECT, broker_url="tcp://here:1")
    (origin,) = Worker.seen
    assert origin.port == "client" and origin.identity == IDENTITY
    assert isinstance(origin.envelope, ClientRequest)


async def test_a_client_request_refused_is_answered_with_its_error_and_redirect(system: ActorSystem, outboxes) -> None:
    """A DanubeError raised by a request's handler reaches the client as an `Error` with
    the request's id, code and redirect; no restart."""
    endpoint = await system.spawn(Worker, name="w")
    system.tell(endpoint, client(cp.Lookup(request_id=8, topic="/ns/moved")))
    _, answer = await answer_on(outboxes["client"], cp.CLIENT_PROTOCOL)
    assert answer == Error(request_id=8, code=ErrorCode.UNAVAILABLE, message="served elsewhere",
                           redirect_url="tcp://other:1")
    assert system.statistics().restarts == 0


async def test_a_client_request_failing_with_a_bug_is_answered_internal_and_restarts(
        system: ActorSystem, outboxes) -> None:
    """A request whose handler raises a non-DanubeError: the client gets INTERNAL with
    its request id, and the actor restarts."""
    endpoint = await system.spawn(Worker, name="w")
    system.tell(endpoint, client(cp.Lookup(request_id=9, topic="/ns/bug")))
    _, answer = await answer_on(outboxes["client"], cp.CLIENT_PROTOCOL)
    assert isinstance(answer, Error) and answer.request_id == 9 and answer.code == ErrorCode.INTERNAL
    assert "ValueError: a bug" in answer.message
    await wait_for(lambda: Worker.instances == 2)


async def test_a_client_request_the_actor_does_not_handle_gets_an_error_naming_it(
        system: ActorSystem, outboxes) -> None:
    """A client request of a type this actor has no handler for: an `Error` naming the
    type, counted as unrecognized, no restart."""
    endpoint = await system.spawn(Worker, name="w")
    system.tell(endpoint, client(cp.GetPartitions(request_id=10, topic="/ns/t")))
    _, answer = await answer_on(outboxes["client"], cp.CLIENT_PROTOCOL)
    assert isinstance(answer, Error) and answer.request_id == 10 and answer.code == ErrorCode.INVALID_ARGUMENT
    assert "no handler for GetPartitions" in answer.message
    assert stats(system, "w").unrecognized_messages == 1 and system.statistics().restarts == 0


async def test_a_refused_request_without_a_request_id_is_not_answered(system: ActorSystem, outboxes) -> None:
    """A `Flow` carries no request id: its refusal is counted, and nothing is sent."""
    endpoint = await system.spawn(Worker, name="w")
    system.tell(endpoint, client(cp.Flow(consumer_id=1, permits=10)))
    system.tell(endpoint, client(cp.Lookup(request_id=11, topic="/ns/t")))
    _, answer = await answer_on(outboxes["client"], cp.CLIENT_PROTOCOL)
    assert answer.request_id == 11  # the first thing on the outbox: nothing for the Flow
    assert stats(system, "w").refused_messages == 1


async def test_a_request_handler_returning_nothing_sends_nothing_and_sees_the_envelope(
        system: ActorSystem, outboxes) -> None:
    """None from a request handler sends nothing (someone answers later); the origin
    carries the envelope's extras (a producer's resolved schema)."""
    endpoint = await system.spawn(Worker, name="w")
    schema = ProducerSchema(topic=None, version=SchemaVersionRef(schema_id=1, version=2, schema_type="String",
                                                                definition=b""))
    create = cp.CreateProducer(request_id=12, topic="/ns/t", producer_name="p")
    system.tell(endpoint, ClientRequest(identity=IDENTITY, frame=cp.CLIENT_PROTOCOL.encode(create), schema=schema))
    await wait_for(lambda: len(Worker.seen) == 1)
    assert Worker.seen[0].envelope.schema == schema
    with pytest.raises(zmq.Again):
        outboxes["client"].recv_multipart(zmq.NOBLOCK)


async def test_a_group_of_client_requests_is_one_mailbox_message_each_answered_on_its_own(
        system: ActorSystem, outboxes) -> None:
    """`ClientRequests` (a round's batches for one actor, from several connections) is
    one mailbox message, unwrapped into one request per frame, in order, each under the
    failure rule: an answer, a refusal and a bug each reach only their own connection,
    and the request after the bug is served by the restarted actor."""
    endpoint = await system.spawn(Worker, name="w")
    lookups = [cp.Lookup(request_id=31, topic="/ns/t"), cp.Lookup(request_id=32, topic="/ns/moved"),
               cp.Lookup(request_id=33, topic="/ns/bug"), cp.Lookup(request_id=34, topic="/ns/t")]
    identities = [b"conn-a", b"conn-b", b"conn-c", b"conn-a"]
    assert system.tell(endpoint, ClientRequests(identities=identities,
                                                frames=[cp.CLIENT_PROTOCOL.encode(m) for m in lookups]))
    answers = [await answer_on(outboxes["client"], cp.CLIENT_PROTOCOL) for _ in range(4)]
    assert [identity for identity, _ in answers] == identities
    assert answers[0][1] == cp.LookupResult(request_id=31, kind=cp.LookupKind.CONNECT, broker_url="tcp://here:1")
    assert answers[1][1] == Error(request_id=32, code=ErrorCode.UNAVAILABLE, message="served elsewhere",
                                  redirect_url="tcp://other:1")
    assert answers[2][1].request_id == 33 and answers[2][1].code == ErrorCode.INTERNAL
    assert answers[3][1].request_id == 34 and isinstance(answers[3][1], cp.LookupResult)
    assert Worker.instances == 2 and [origin.identity for origin in Worker.seen] == identities
    assert stats(system, "w").handled_messages == 1  # one message in the mailbox for the four


async def test_admin_requests_are_answered_on_the_admin_port(system: ActorSystem, outboxes) -> None:
    """An `AdminRequest` is unwrapped the same way and answered on the admin outbox:
    the answer, a refusal, and an error naming a type the actor does not handle."""
    endpoint = await system.spawn(Worker, name="w")
    system.tell(endpoint, admin(ap.ListNamespaces(request_id=1)))
    system.tell(endpoint, admin(ap.CreateNamespace(request_id=2, namespace="x")))
    system.tell(endpoint, admin(ap.ListBrokers(request_id=3)))
    answers = [(await answer_on(outboxes["admin"], ap.ADMIN_PROTOCOL))[1] for _ in range(3)]
    assert answers[0] == ap.NamespaceList(request_id=1, namespaces=["a"])
    assert answers[1] == Error(request_id=2, code=ErrorCode.INVALID_ARGUMENT, message="bad namespace x")
    assert answers[2].request_id == 3 and "no handler for ListBrokers" in answers[2].message
    assert system.statistics().restarts == 0


async def test_a_client_request_that_does_not_decode_is_answered_with_its_request_id(
        system: ActorSystem, outboxes) -> None:
    """A gateway routes a producer's `Send` by the ids at its head without decoding it, so
    the actor is the first to decode it: a batch that does not decode is the client's
    fault, answered INVALID_ARGUMENT with the request id read from the frame's head (the
    client matches it to its batch), counted as a bad frame, never a restart."""
    endpoint = await system.spawn(Worker, name="w")
    bad_frames = METRICS.bad_frames._value.get()
    frame = msgpack.packb([cp.Send.TAG, 21, 5, ["not bytes"], [0]], use_bin_type=True)
    assert cp.peek_send(frame) == (21, 5)
    system.tell(endpoint, ClientRequest(identity=IDENTITY, frame=frame))
    _, answer = await answer_on(outboxes["client"], cp.CLIENT_PROTOCOL)
    assert isinstance(answer, Error) and answer.request_id == 21 and answer.code == ErrorCode.INVALID_ARGUMENT
    assert METRICS.bad_frames._value.get() == bad_frames + 1
    assert system.statistics().restarts == 0 and Worker.instances == 1


# ------------------------------------------------------------------ the table
def test_a_handler_name_shared_by_an_internal_message_and_a_request_fails_at_class_creation(monkeypatch) -> None:
    """A handler for a name that an internal message and a client/admin request share
    would be called two ways: defining one is refused when the class is created."""
    monkeypatch.setattr(actor_module, "_CLASHING", frozenset({"Tick"}))
    with pytest.raises(TypeError, match="handle_Tick"):
        type("Clash", (Actor,), {"handle_Tick": lambda self, msg: None})


def test_no_internal_message_shares_a_name_with_a_client_or_admin_request() -> None:
    """Today's protocols hold no such clash (the check above guards new ones)."""
    assert actor_module._CLASHING == frozenset()


def test_every_admin_and_client_request_the_broker_takes_has_a_handle_method() -> None:
    """Every admin request type is a `handle_<Type>` method of the actor class the admin
    gateway's route table sends it to, and every client request type one of the gateway
    (which reads it off the socket) and of the actor that answers it: one search finds
    each hop."""
    from danube_zmq.actors.broker.broker import BrokerActor
    from danube_zmq.actors.broker.snapshot_actor import SnapshotActor
    from danube_zmq.actors.policy.policy_keeper import PolicyKeeper
    from danube_zmq.actors.schema.registry_admin import RegistryAdmin
    from danube_zmq.actors.sockets.admin_gateway import ROUTES, AdminGateway
    from danube_zmq.actors.sockets.gateway import Gateway
    from danube_zmq.actors.subscription import SubscriptionActor
    from danube_zmq.actors.topic import TopicActor

    # The admin gateway's routes: each admin request goes to the actor with its handler.
    routed_to = {None: AdminGateway, "broker_endpoint": BrokerActor, "snapshot_endpoint": SnapshotActor,
                 "policy_endpoint": PolicyKeeper, "registry_admin_endpoint": RegistryAdmin}
    wanted = ap.ADMIN_REQUESTS + ap.SNAPSHOT_REQUESTS + ap.CLUSTER_REQUESTS + ap.SECURITY_REQUESTS
    assert set(ROUTES) == set(wanted)
    missing = [f"{routed_to[route.endpoint].__name__}.handle_{t.__name__}" for t, route in ROUTES.items()
               if t.__name__ not in routed_to[route.endpoint]._handlers]
    assert missing == []

    answered_by = {
        BrokerActor: ("Lookup", "GetPartitions", "CreateProducer", "Subscribe"),
        TopicActor: ("CreateProducer", "Send", "CloseProducer", "Subscribe"),
        SubscriptionActor: ("Flow", "Ack", "Nack", "Unsubscribe", "CloseConsumer", "Seek", "GetLastOffset"),
        RegistryAdmin: ("GetTopicsOfNamespace",),
        Gateway: ("Connect", "Ping", "HealthCheck") + tuple(t.__name__ for t in cp.SCHEMA_REQUESTS),
    }
    requests = {t.__name__ for t in cp.CLIENT_REQUESTS}
    assert {name for names in answered_by.values() for name in names} == requests
    missing = [f"{c.__name__}.handle_{name}" for c, names in answered_by.items() for name in names
               if not callable(getattr(c, f"handle_{name}", None))]
    missing += [f"Gateway.handle_{name}" for name in sorted(requests) if name not in Gateway._handlers]
    assert missing == []
    assert "ClientRequest" not in TopicActor._handlers and "ClientRequest" not in SubscriptionActor._handlers


# ------------------------------------------------------------------ request tasks
async def test_a_request_task_that_raises_has_its_exception_logged_and_retrieved(caplog) -> None:
    """A task of `RequestTasks` that raises: its exception is logged with the task's
    traceback, never left for asyncio's "Task exception was never retrieved"."""

    async def fails() -> None:
        raise ValueError("lost answer")

    caplog.set_level(logging.ERROR)
    tasks = RequestTasks(4)
    assert tasks.start(fails())
    await wait_for(lambda: not tasks._tasks)
    await asyncio.sleep(0)
    gc.collect()
    messages = [r.getMessage() for r in caplog.records]
    assert not any("never retrieved" in m for m in messages)
    logged = [r for r in caplog.records if r.exc_info and isinstance(r.exc_info[1], ValueError)]
    assert logged and "lost answer" in str(logged[0].exc_info[1])


async def test_a_request_answered_in_a_task_meets_the_one_failure_rule(caplog) -> None:
    """`RequestTasks.answer`: the reply is what the request's coroutine returns; a
    DanubeError it raises is the answer as it is; anything else is logged and answered
    INTERNAL naming the request and the exception, as the actor system answers a
    handler's (`answer_of`)."""
    from danube_zmq.runtime.request_tasks import answer_of
    from danube_zmq.transport.common import Ok
    from danube_zmq.transport.errors import InternalError, NotFound

    async def ok() -> Ok:
        return Ok(request_id=7)

    async def refused() -> Ok:
        raise NotFound("no such topic")

    async def bug() -> Ok:
        raise KeyError("oops")

    caplog.set_level(logging.ERROR)
    tasks = RequestTasks(4)
    replies: dict[str, object] = {}
    for name, coro in (("Ok", ok()), ("Refused", refused()), ("Bug", bug())):
        assert tasks.answer(coro, name, lambda reply, name=name: replies.__setitem__(name, reply))
    await wait_for(lambda: len(replies) == 3)
    assert replies["Ok"] == Ok(request_id=7)
    assert isinstance(replies["Refused"], NotFound) and replies["Refused"].message == "no such topic"
    assert isinstance(replies["Bug"], InternalError)
    assert replies["Bug"].message == "Bug failed: KeyError: 'oops'" == answer_of("Bug", KeyError("oops")).message
    assert [r for r in caplog.records if r.exc_info and isinstance(r.exc_info[1], KeyError)]
    assert not [r for r in caplog.records if r.exc_info and isinstance(r.exc_info[1], NotFound)]
