#!/usr/bin/env bash
# Install Debian's `prometheus` (the server) when missing: the metrics test
# (tests/integration/actors/test_prometheus.py) runs a real Prometheus scraping a 3-broker
# cluster on loopback. Idempotent and quiet: nothing is done when `prometheus` is on
# PATH. Needs root; waits for another apt run's lock rather than failing.
# Usage: scripts/install-prometheus.sh
set -euo pipefail

if command -v prometheus >/dev/null 2>&1; then
    exit 0
fi
if [[ "$(id -u)" -ne 0 ]]; then
    echo "install-prometheus: prometheus missing and not root: install it (apt-get install prometheus)" >&2
    exit 1
fi
if ! command -v apt-get >/dev/null 2>&1; then
    echo "install-prometheus: prometheus missing and no apt-get on this machine" >&2
    exit 1
fi

export DEBIAN_FRONTEND=noninteractive
apt_options=(-q -y -o DPkg::Lock::Timeout=300 -o Acquire::Retries=3)
# --no-install-recommends: the server alone (no node exporter, no web assets beyond its own).
if ! apt-get install "${apt_options[@]}" --no-install-recommends prometheus >/dev/null 2>&1; then
    apt-get update -q -o DPkg::Lock::Timeout=300 >/dev/null
    apt-get install "${apt_options[@]}" --no-install-recommends prometheus >/dev/null
fi
if ! command -v prometheus >/dev/null 2>&1; then
    echo "install-prometheus: prometheus still missing after apt-get install prometheus" >&2
    exit 1
fi
