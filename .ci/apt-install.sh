#!/usr/bin/env bash
# System packages the tests need (multi-host harness, MPI, SLURM, async I/O). Idempotent.
set -euo pipefail
PKGS="openssh-server openssh-client pdsh iproute2 openmpi-bin libopenmpi-dev mpich slurm-wlm munge libaio-dev fio procps"
missing=""
for p in $PKGS; do dpkg -s "$p" >/dev/null 2>&1 || missing="$missing $p"; done
if [ -n "$missing" ]; then
  if [ "$(id -u)" != 0 ]; then echo "apt-install: need root to install:$missing" >&2; exit 1; fi
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -q
  apt-get install -y -q --no-install-recommends $missing
fi
