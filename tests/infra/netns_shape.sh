#!/usr/bin/env bash
# Put a rate limit on every fake host's link, or take it off:
#
#   netns_shape.sh 1gbit     # token bucket (tbf) on eth0's egress in each dsl-<prefix>N namespace
#   netns_shape.sh clear     # remove it (idempotent)
#
# Each host's egress is limited, so every byte that leaves a host for another one passes one
# bucket; traffic between two ranks of the same host never touches eth0 (the kernel routes a
# namespace's own address over lo) and stays unlimited, as on a real node.
#
# Only the rate can be shaped on this kernel: tbf is built in, but netem (delay, loss, jitter) is
# not (CONFIG_NET_SCH_NETEM unset, no loadable modules), so `tc qdisc add ... netem` answers
# "Specified qdisc kind is unknown". Added latency is therefore not simulated.
set -euo pipefail
RATE=${1:?usage: netns_shape.sh RATE|clear   (RATE as tc writes it: 1gbit, 200mbit)}
PREFIX=${DSL_HOST_PREFIX:-host}
found=0
for ns in $(ip netns list | awk '{print $1}' | grep "^dsl-${PREFIX}" || true); do
  found=1
  ip netns exec "$ns" tc qdisc del dev eth0 root 2>/dev/null || true
  if [ "$RATE" != clear ]; then
    # the bucket must hold at least one tick's worth of bytes (rate / HZ); 512 KiB covers
    # rates up to ~10 Gbit/s at HZ 250
    ip netns exec "$ns" tc qdisc add dev eth0 root tbf rate "$RATE" burst 512kb latency 100ms
  fi
  echo "$ns: $(ip netns exec "$ns" tc qdisc show dev eth0 | head -1)"
done
[ "$found" = 1 ] || { echo "no dsl-${PREFIX}* namespaces: bring them up with netns_up.sh" >&2; exit 1; }
