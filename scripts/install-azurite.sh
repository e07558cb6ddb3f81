#!/usr/bin/env bash
# Install the Azurite blob emulator (npm package `azurite`, major 3) into a project-local folder.
#
# The az:// integration tests (tests/emulators.py) run this when
# .cache/azurite/node_modules/.bin/azurite-blob is missing; nothing is installed globally.
# Usage: scripts/install-azurite.sh [prefix]   (default: <repo>/.cache/azurite)
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
prefix="${1:-$root/.cache/azurite}"
mkdir -p "$prefix"
bin="$prefix/node_modules/.bin/azurite-blob"
if [[ -x "$bin" ]]; then
    echo "$bin"
    exit 0
fi

if ! command -v npm >/dev/null 2>&1; then
    echo "install-azurite: npm not found on PATH (node 18+ is required)" >&2
    exit 127
fi

# Node does not read the system CA bundle by itself; without it npm cannot reach the
# registry through a TLS-inspecting network and waits until its timeouts.
if [[ -z "${NODE_EXTRA_CA_CERTS:-}" && -f /etc/ssl/certs/ca-certificates.crt ]]; then
    export NODE_EXTRA_CA_CERTS=/etc/ssl/certs/ca-certificates.crt
fi

# --no-audit/--no-fund: no extra registry calls and no noise; --prefix keeps it under .cache/.
# Bounded fetches: a registry that does not answer fails fast and is retried below.
for attempt in 1 2 3; do
    if npm install --no-audit --no-fund --loglevel=error --fetch-timeout=60000 --fetch-retries=2 \
            --prefix "$prefix" azurite@3; then
        break
    fi
    echo "install-azurite: npm install failed (attempt $attempt of 3)" >&2
    sleep $((attempt * 5))
done

if [[ ! -x "$bin" ]]; then
    echo "install-azurite: npm finished but $bin is missing" >&2
    exit 1
fi
echo "$bin"
