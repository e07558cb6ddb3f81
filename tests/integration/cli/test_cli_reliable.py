"""The `danube` command on a reliable topic: create it, produce with --reliable, consume
and acknowledge, see the cursor in `admin topics describe`, and the refusal of a
non-reliable producer."""

from __future__ import annotations

import json

from tests.integration.cli.test_cli_e2e import danube


def test_cli_reliable_topic_produce_consume_ack_and_describe(broker) -> None:
    """A reliable topic made with `admin topics create --dispatch-strategy reliable`
    gets offsets 0..9 from `produce --reliable`; `consume` from earliest receives and
    acks them, so a second `consume` run on that subscription gets nothing; `describe`
    shows cursor 9 and backlog 0; a non-reliable `produce` fails with one `error:` line
    naming the dispatch strategy."""
    admin = ("admin", "--endpoint", broker.admin_url)
    created = danube(*admin, "topics", "create", "/default/x", "--dispatch-strategy", "reliable")
    assert created.returncode == 0, created.stderr

    sent = danube("produce", "-s", broker.url, "--reliable", "-t", "/default/x", "-m", "hi", "-c", "10", "--json")
    assert sent.returncode == 0, sent.stderr
    assert [json.loads(line)["offset"] for line in sent.stdout.splitlines()] == list(range(10))

    got = danube("consume", "-s", broker.url, "-t", "/default/x", "-m", "s", "--initial-position", "earliest",
                 "-c", "10", "--timeout", "10", "--json")
    assert got.returncode == 0, got.stderr
    messages = [json.loads(line) for line in got.stdout.splitlines()]
    assert [m["offset"] for m in messages] == list(range(10))
    assert {m["payload"] for m in messages} == {"hi"}

    # The first run acknowledged all ten before it exited: nothing is redelivered.
    again = danube("consume", "-s", broker.url, "-t", "/default/x", "-m", "s", "--timeout", "2", "--json")
    assert again.returncode == 0, again.stderr
    assert again.stdout.strip() == "", again.stdout

    described = danube(*admin, "topics", "describe", "/default/x", "--output", "json")
    assert described.returncode == 0, described.stderr
    info = json.loads(described.stdout)
    assert info["dispatch_strategy"] == "reliable"
    [partition] = info["partitions"]
    assert partition["next_offset"] == 10
    [subscription] = partition["subscriptions"]
    assert subscription["name"] == "s"
    assert subscription["cursor"] == 9 and subscription["backlog_messages"] == 0, subscription
    assert subscription["unacked_messages"] == 0, subscription

    refused = danube("produce", "-s", broker.url, "-t", "/default/x", "-m", "hi")
    assert refused.returncode != 0
    lines = [line for line in refused.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:"), refused.stderr
    assert "reliable" in lines[0], lines[0]
    assert "Traceback" not in refused.stderr
