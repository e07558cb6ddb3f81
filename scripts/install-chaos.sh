#!/usr/bin/env bash
# Install the Debian packages the chaos harness (tests/chaos/harness/) needs, when missing:
#   nftables  - `nft`: partitions and random loss inside the namespace hosts (tests/chaos/harness/faults.py)
#   iptables  - the fallback for partitions where nft is unusable
#   faketime  - libfaketime (tests/chaos/harness/clock.py explains why its own shim is used instead)
#   gcc       - builds tests/chaos/harness/clock.py's wall-clock shim (clock faults, scenario R4)
# Idempotent and quiet: nothing is done when every command is present. Needs root (the
# harness runs as root: network namespaces need it too). Waits for another apt run's lock
# rather than failing (two chaos runs, or a helper's install, may overlap).
# Usage: scripts/install-chaos.sh
set -euo pipefail

declare -A wanted=([nft]=nftables [iptables]=iptables [faketime]=faketime [cc]=gcc)
missing=()
for command in "${!wanted[@]}"; do
    if ! command -v "$command" >/dev/null 2>&1 && [[ ! -x "/usr/sbin/$command" ]]; then
        missing+=("${wanted[$command]}")
    fi
done
if [[ ${#missing[@]} -eq 0 ]]; then
    exit 0
fi
if [[ "$(id -u)" -ne 0 ]]; then
    echo "install-chaos: ${missing[*]} missing and not root: install them (apt-get install ${missing[*]})" >&2
    exit 1
fi
if ! command -v apt-get >/dev/null 2>&1; then
    echo "install-chaos: ${missing[*]} missing and no apt-get on this machine" >&2
    exit 1
fi

export DEBIAN_FRONTEND=noninteractive
apt_options=(-q -y -o DPkg::Lock::Timeout=300 -o Acquire::Retries=3)
# The package lists may be absent (a fresh container): one update, then retry the install.
if ! apt-get install "${apt_options[@]}" --no-install-recommends "${missing[@]}" >/dev/null 2>&1; then
    apt-get update -q -o DPkg::Lock::Timeout=300 >/dev/null
    apt-get install "${apt_options[@]}" --no-install-recommends "${missing[@]}" >/dev/null
fi
for command in "${!wanted[@]}"; do
    if ! command -v "$command" >/dev/null 2>&1 && [[ ! -x "/usr/sbin/$command" ]]; then
        echo "install-chaos: $command still missing after apt-get install ${missing[*]}" >&2
        exit 1
    fi
done
