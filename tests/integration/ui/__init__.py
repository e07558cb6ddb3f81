"""The web console in a real headless Chromium (marker ui, tox -e ui)."""
