"""Fixtures shared by every test folder: the object-store emulators (tests/emulators.py),
the rotation of seeded repeated runs across CI runs (tests/rotation.py), pytester (to
test that rotation), and hypothesis without its per-example deadline: a property test
fails on what it checks, never on how long an example took on a busy 2-core machine (a
deadline is a timed unit test)."""

from hypothesis import settings

settings.register_profile("danube", deadline=None)
settings.load_profile("danube")

pytest_plugins = ["tests.emulators", "tests.rotation", "pytester"]
