"""A Spark standalone cluster on loopback (one master, one worker) started from the
installed pyspark's own launcher (`pyspark/bin/spark-class`), for the report and the
spark suites: one per test process (`spark_standalone`, tests/conftest.py), since its
two JVMs take many seconds to start on a loaded machine and the tests only submit
applications to it."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

__all__ = ["SparkCluster", "apps"]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _wait_port(port: int, process: subprocess.Popen[bytes], log: Path, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"spark process exited ({process.returncode}):\n{log.read_text()[-3000:]}")
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.2)
    raise RuntimeError(f"spark process did not listen on {port} within {timeout_s} s:\n{log.read_text()[-3000:]}")


def apps(cluster: SparkCluster) -> set[str]:
    """The applications whose executors the worker ran (a directory each)."""
    work = cluster.work_dir / "work"
    return {p.name for p in work.iterdir() if p.name.startswith("app-")} if work.is_dir() else set()


class SparkCluster:
    def __init__(self, work_dir: Path) -> None:
        import pyspark

        self.home = Path(pyspark.__file__).parent
        self.work_dir = work_dir
        self.port = _free_port()
        self.url = f"spark://127.0.0.1:{self.port}"
        self.processes: list[subprocess.Popen[bytes]] = []
        self.env = {**os.environ, "SPARK_HOME": str(self.home), "SPARK_LOCAL_IP": "127.0.0.1",
                    "PYSPARK_PYTHON": sys.executable, "SPARK_NO_DAEMONIZE": "1"}

    def _start(self, name: str, *args: str) -> tuple[subprocess.Popen[bytes], Path]:
        log = self.work_dir / f"{name}.log"
        with open(log, "wb") as out:
            process = subprocess.Popen([str(self.home / "bin" / "spark-class"), *args], stdout=out,
                                       stderr=subprocess.STDOUT, env=self.env, cwd=self.work_dir)
        self.processes.append(process)
        return process, log

    def start(self) -> SparkCluster:
        try:
            master, log = self._start("master", "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
                                      "--port", str(self.port), "--webui-port", str(_free_port()))
            _wait_port(self.port, master, log)
            worker_port = _free_port()
            worker, log = self._start("worker", "org.apache.spark.deploy.worker.Worker", self.url,
                                      "--host", "127.0.0.1", "--port", str(worker_port),
                                      "--webui-port", str(_free_port()), "--cores", "2", "--memory", "1g",
                                      "--work-dir", str(self.work_dir / "work"))
            _wait_port(worker_port, worker, log)
            self._wait_registered()
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_registered(self, timeout_s: float = 60) -> None:
        deadline = time.monotonic() + timeout_s
        log = self.work_dir / "master.log"
        while time.monotonic() < deadline:
            if "Registering worker" in log.read_text(errors="replace"):
                return
            time.sleep(0.2)
        raise RuntimeError(f"the worker did not register with the master:\n{log.read_text()[-3000:]}")

    def stop(self) -> None:
        for process in reversed(self.processes):
            if process.poll() is None:
                process.terminate()
                try:
                    process.wait(15)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait(5)
        self.processes.clear()
