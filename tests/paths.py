"""Where things are, for tests at any depth of tests/: the checkout and the package."""

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "danube_zmq"
