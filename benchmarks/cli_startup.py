"""How long the `danube` command takes to start: the median of `--runs` runs of each case.

    .venv/bin/python benchmarks/cli_startup.py --runs 15
    .venv/bin/python benchmarks/cli_startup.py --runs 15 --python before=/path/.venv/bin/python \
        --python after=.venv/bin/python            # an A/B: cases alternate between the venvs

Cases, each a new process of the venv's interpreter (wall time, from spawn to exit):

- `help`: `danube --help`
- `produce_help`: `danube produce --help`
- `import_cli`: `python -c "import danube_zmq.cli.main"`
- `import_client`: `python -c "import danube_zmq.client"` (what `danube produce` loads
  before it connects)
- `python`: `python -c pass`, the interpreter's own floor
- `produce`: a whole `danube produce -m hi` (connect, send, receipt, close) against the
  broker at `--service-url`, when given (start one first: `danube broker start`)

`danube` runs as `python -m danube_zmq.cli.main`, the console script's code path. The
runs of all cases and venvs alternate, so load on the machine hits all alike. Prints one
JSON line (medians in ms) and appends it to benchmarks/results/cli_startup.jsonl.
Per-module costs: `python -X importtime -m danube_zmq.cli.main produce --help`.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

CASES: dict[str, list[str]] = {
    "help": ["-m", "danube_zmq.cli.main", "--help"],
    "produce_help": ["-m", "danube_zmq.cli.main", "produce", "--help"],
    "import_cli": ["-c", "import danube_zmq.cli.main"],
    "import_client": ["-c", "import danube_zmq.client"],
    "python": ["-c", "pass"],
}
RESULTS = Path(__file__).resolve().parent / "results" / "cli_startup.jsonl"


def run_once(python: str, args: list[str]) -> float:
    """Wall seconds of one process, from spawn to exit."""
    start = time.perf_counter()
    subprocess.run([python, *args], check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                   cwd="/", timeout=120)  # cwd /: the tree's folders are not importable by accident
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=15, help="runs of each case (median reported)")
    parser.add_argument("--python", action="append", default=[], metavar="LABEL=PYTHON",
                        help="a venv's interpreter to measure (repeatable); default: this one")
    parser.add_argument("--service-url", metavar="URL",
                        help="a running broker's client endpoint: adds the whole `danube produce` case")
    options = parser.parse_args()
    cases = dict(CASES)
    if options.service_url:
        cases["produce"] = ["-m", "danube_zmq.cli.main", "produce", "-s", options.service_url,
                            "-t", "/default/cli-startup", "-m", "hi"]
    pythons = {label: os.path.abspath(python) for label, python in (entry.split("=", 1) for entry in options.python)}
    pythons = pythons or {"this": sys.executable}
    for python in pythons.values():  # warm: the first start of a venv reads its files from disk
        for args in cases.values():
            run_once(python, args)
    samples: dict[str, list[float]] = {f"{case}[{label}]": [] for label in pythons for case in cases}
    for _ in range(options.runs):
        for label, python in pythons.items():
            for case, args in cases.items():
                samples[f"{case}[{label}]"].append(run_once(python, args))
    result = {
        "when": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "runs": options.runs,
        "loadavg_1m": round(os.getloadavg()[0], 2),
        "cpus": os.cpu_count(),
        "median_ms": {name: round(statistics.median(times) * 1000, 1) for name, times in samples.items()},
    }
    line = json.dumps(result)
    print(line)
    RESULTS.parent.mkdir(exist_ok=True)
    with RESULTS.open("a") as results:
        results.write(line + "\n")


if __name__ == "__main__":
    main()
