"""The built wheel is the whole product: installed into a clean venv, it runs the demo.

setup.cfg finds the packages under danube_zmq/; a package data file or a folder
without its `__init__.py` still works from the source tree (an editable install reads
the folders), so only a wheel shows it. This builds one from a copy of the tree, installs it with its dependencies into a
new venv, and runs everything from a temporary directory, where no source folder is
importable.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

from tests.integration.conftest import free_port
from tests.paths import ROOT

# Generous: a cold pip cache downloads pyarrow (about 18 s warm).
INSTALL_TIMEOUT_S = 600

# Run by the installed interpreter: every module of the source tree must be found, and
# found in the venv (not in a source folder), with the package data beside it.
_CHECK_INSTALLED = """
import importlib.util, pathlib, sys
prefix = pathlib.Path(sys.prefix).resolve()
missing = []
for name in sys.argv[1:]:
    try:
        spec = importlib.util.find_spec(name)
    except ImportError as error:
        spec, name = None, f"{name} ({error})"
    if spec is None or prefix not in pathlib.Path(spec.origin).resolve().parents:
        missing.append(name if spec is None else f"{name} from {spec.origin}")
typed = pathlib.Path(importlib.util.find_spec("danube_zmq").origin).with_name("py.typed")
if not typed.exists():
    missing.append("danube_zmq/py.typed")
print("\\n".join(missing))
sys.exit(1 if missing else 0)
"""


# Only in extras (setup.cfg): danube bench's numpy and hdrhistogram. A command that needs
# one names its extra.
EXTRAS_ONLY = ("numpy", "hdrh")
# In the base install although no import names them at start: the schema registry runs
# grpc_tools' protoc on .proto text, and the gRPC doors serve with grpcio.
RUN_TIME = ("grpc_tools", "grpc")
_CHECK_ABSENT = """
import importlib.util, sys
found = [name for name in sys.argv[1:] if importlib.util.find_spec(name) is not None]
print("\\n".join(found))
sys.exit(1 if found else 0)
"""


def source_modules() -> list[str]:
    """Every module of the danube_zmq package in the source tree."""
    names = []
    for path in sorted((ROOT / "danube_zmq").rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        names.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return names


def build_wheel(work: Path) -> Path:
    """A wheel of a copy of the tree (a build writes build/ and egg-info where it runs)."""
    source = work / "source"
    shutil.copytree(ROOT, source, ignore=shutil.ignore_patterns(
        ".git", ".venv", ".tox", "build", "dist", "*.egg-info", "__pycache__", "tests", "benchmarks",
        ".hypothesis", ".ruff_cache", "danube-data"))
    isolation = [] if importlib.util.find_spec("setuptools") is None else ["--no-build-isolation"]
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", *isolation, "-q",
                            "-w", str(work / "dist"), str(source)],
                           capture_output=True, text=True, timeout=INSTALL_TIMEOUT_S)
    assert built.returncode == 0, built.stdout + built.stderr
    (wheel,) = (work / "dist").glob("danube_zmq-*.whl")
    return wheel


def test_wheel_in_a_clean_venv_has_every_module_and_runs_the_demo(tmp_path: Path) -> None:
    """Build the wheel, `pip install` it (dependencies resolved by pip) into a new venv,
    then from a directory outside the tree: every source module is found inside the venv,
    the `danube` entry point answers, the extras' packages (EXTRAS_ONLY) are not installed
    and the commands that need them name their extra (`danube bench`, a broker with a
    gRPC door), and examples/quickstart.py (what `./run demo` runs)
    starts a broker, receives the 5 messages it sent and stops it cleanly. A module
    missing from the wheel fails here, and so does anything shipped outside danube_zmq/."""
    wheel = build_wheel(tmp_path)
    with zipfile.ZipFile(wheel) as archive:  # the console's pages and assets are package data
        shipped = set(archive.namelist())
    for name in ("templates/base.html", "templates/topic.html", "static/console.js", "static/console.css"):
        assert f"danube_zmq/doors/console/{name}" in shipped, name
    # the product alone: no test, benchmark or chaos-harness module rides along
    assert {name.split("/")[0] for name in shipped if not name.split("/")[0].endswith(".dist-info")} == {"danube_zmq"}
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=INSTALL_TIMEOUT_S)
    python = venv / "bin" / "python"
    # Without the tests' PYTHONPATH (the checkout, for the chaos harness): pip would take
    # the source tree's egg-info for an installed danube-zmq and install nothing.
    clean = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    installed = subprocess.run([str(python), "-m", "pip", "install", "-q", str(wheel)], env=clean,
                               capture_output=True, text=True, timeout=INSTALL_TIMEOUT_S)
    assert installed.returncode == 0, installed.stdout + installed.stderr

    outside = tmp_path / "run"
    outside.mkdir()
    shutil.copy(ROOT / "examples" / "quickstart.py", outside)
    env = {"PATH": f"{venv / 'bin'}:/usr/bin:/bin", "HOME": str(outside)}

    check = subprocess.run([str(python), "-c", _CHECK_INSTALLED, *source_modules()], cwd=outside,
                           env=env, capture_output=True, text=True, timeout=120)
    assert check.returncode == 0, "not installed from the wheel:\n" + check.stdout + check.stderr

    help_text = subprocess.run([str(venv / "bin" / "danube"), "--help"], cwd=outside, env=env,
                               capture_output=True, text=True, timeout=60)
    assert help_text.returncode == 0, help_text.stdout + help_text.stderr
    assert "broker" in help_text.stdout

    absent = subprocess.run([str(python), "-c", _CHECK_ABSENT, *EXTRAS_ONLY], cwd=outside, env=env,
                            capture_output=True, text=True, timeout=60)
    assert absent.returncode == 0, "in the base install, not only in an extra:\n" + absent.stdout + absent.stderr
    bench = subprocess.run([str(venv / "bin" / "danube"), "bench", "e2e", "--help"], cwd=outside, env=env,
                           capture_output=True, text=True, timeout=60)
    assert (bench.returncode, bench.stderr.strip()) == (1, "error: danube bench needs numpy, which is not installed;"
                                                           " install the bench extra: pip install 'danube-zmq[bench]'")
    present = subprocess.run([str(python), "-c", _CHECK_ABSENT, *RUN_TIME], cwd=outside, env=env,
                             capture_output=True, text=True, timeout=60)
    assert present.stdout.split() == list(RUN_TIME), present.stdout + present.stderr

    url, admin_url = f"tcp://127.0.0.1:{free_port()}", f"tcp://127.0.0.1:{free_port()}"
    demo = subprocess.run([str(python), "quickstart.py", "--listen", url, "--admin-listen", admin_url],
                          cwd=outside, env=env, capture_output=True, text=True, timeout=120)
    assert demo.returncode == 0, demo.stdout + demo.stderr
    assert demo.stdout.count("received offset=") == 5
    assert "broker stopped (exit code 0)" in demo.stdout
