"""Fixtures shared by every test folder: the object-store emulators (tests/emulators.py)."""

pytest_plugins = ["tests.emulators"]
