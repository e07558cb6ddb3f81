"""SIGUSR1 makes a running broker write every thread's stack to its log and go on:
how an operator (and the test fixtures, before they kill a broker that did not stop)
learns where a broker is waiting."""

from __future__ import annotations

import signal
import time

from tests.integration.conftest import BrokerProcess, wait_ready


def test_sigusr1_writes_every_threads_stack_and_the_broker_keeps_serving(broker: BrokerProcess) -> None:
    """The dump names the main thread's frames, and the broker still answers afterwards
    and stops cleanly (the fixture checks exit 0)."""
    broker.process.send_signal(signal.SIGUSR1)
    deadline = time.monotonic() + 30
    while "Current thread" not in broker.log() and "Thread 0x" not in broker.log():
        assert time.monotonic() < deadline, f"no stack dump in the log:\n{broker.log()}"
        time.sleep(0.1)
    assert 'File "' in broker.log()
    assert broker.process.poll() is None
    wait_ready(broker.admin_url, broker.process)
