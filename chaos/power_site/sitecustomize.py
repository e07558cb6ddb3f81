"""Put on a namespace host's PYTHONPATH by chaos/scenarios.py (B6, R3): a broker started
there by its host's supervisor (`-m danube_zmq.cli.main broker start ...`, a restart
too) runs with chaos/disk.py's fault-injecting WAL file layer, journalling every fsync
to the journal named in $DANUBE_CHAOS_DISK_CONTROL, so a power loss can be replayed on
its files after a kill -9. Every other process (the supervisor, the CLI) is left alone.
The product is unchanged: this is the launcher of chaos/disk.py for brokers the test
does not start itself."""

import os
import sys

_control = os.environ.get("DANUBE_CHAOS_DISK_CONTROL")
_argv = getattr(sys, "orig_argv", [])
if _control and "danube_zmq.cli.main" in _argv and _argv[_argv.index("danube_zmq.cli.main") + 1:][:2] == [
        "broker", "start"]:
    from pathlib import Path

    from danube_zmq.chaos.disk import FaultyFiles
    from danube_zmq.storage.wal import files

    files.install(FaultyFiles.from_control(Path(_control)))
