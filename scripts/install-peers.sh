#!/usr/bin/env bash
# The peer brokers of benchmarks/side_by_side.py, from Debian packages, when missing.
# Each is installed on its own, so one that fails leaves the others; the suite then
# skips it with a line saying so. Needs root (or sudo) and the package registry.
set -uo pipefail
declare -A PACKAGES=([redis-server]=redis-server [nats-server]=nats-server [mosquitto]=mosquitto
                     [/usr/lib/rabbitmq/bin/rabbitmq-server]=rabbitmq-server)
SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO="sudo -n"; fi
updated=0
for binary in "${!PACKAGES[@]}"; do
  if command -v "$binary" >/dev/null 2>&1 || [ -x "$binary" ]; then continue; fi
  if [ "$updated" = 0 ]; then $SUDO apt-get update -qq || true; updated=1; fi
  package=${PACKAGES[$binary]}
  if DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "$package" >/dev/null; then
    echo "installed $package"
  else
    echo "could not install $package (apt-get failed)" >&2
  fi
done
# etcd 3.4 for benchmarks/raft_vs_etcd.py (Raft writes side by side); `etcd` is its binary.
if ! command -v etcd >/dev/null 2>&1; then
  if [ "$updated" = 0 ]; then $SUDO apt-get update -qq || true; updated=1; fi
  if DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq etcd-server >/dev/null; then
    echo "installed etcd-server"
  else
    echo "could not install etcd-server (apt-get failed)" >&2
  fi
fi
