#!/usr/bin/env bash
# Install Debian's `chromium` and `chromium-driver` when missing: the web console's tests
# (tox -e ui, tests/integration/browser.py) drive a real headless Chromium through
# chromedriver. Idempotent and quiet: nothing is done when both `chromium` and
# `chromedriver` are on PATH. Needs root; waits for another apt run's lock rather than failing.
# Usage: scripts/install-chromium.sh
set -euo pipefail

if command -v chromium >/dev/null 2>&1 && command -v chromedriver >/dev/null 2>&1; then
    exit 0
fi
if [[ "$(id -u)" -ne 0 ]]; then
    echo "install-chromium: chromium or chromedriver missing and not root: install them (apt-get install chromium chromium-driver)" >&2
    exit 1
fi
if ! command -v apt-get >/dev/null 2>&1; then
    echo "install-chromium: chromium or chromedriver missing and no apt-get on this machine" >&2
    exit 1
fi

export DEBIAN_FRONTEND=noninteractive
apt_options=(-q -y -o DPkg::Lock::Timeout=300 -o Acquire::Retries=3)
# --no-install-recommends: the browser and its driver only (no extra fonts, no desktop
# integration); both packages come from the same source, so their versions always match.
packages=(chromium chromium-driver)
if ! apt-get install "${apt_options[@]}" --no-install-recommends "${packages[@]}" >/dev/null 2>&1; then
    apt-get update -q -o DPkg::Lock::Timeout=300 >/dev/null
    apt-get install "${apt_options[@]}" --no-install-recommends "${packages[@]}" >/dev/null
fi
for binary in chromium chromedriver; do
    if ! command -v "$binary" >/dev/null 2>&1; then
        echo "install-chromium: $binary still missing after apt-get install ${packages[*]}" >&2
        exit 1
    fi
done
