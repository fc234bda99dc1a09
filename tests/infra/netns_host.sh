#!/usr/bin/env bash
# Simulate a silent host loss, or bring the host back:
#   netns_host.sh down hostN   link down first (no FIN/RST can leave: like a
#                              pulled cable), then SIGKILL every process in the
#                              host's network namespace (like a power loss).
#   netns_host.sh up hostN     link up, restart its sshd (and its slurmd when
#                              SLURM runs in netns mode).
#   netns_host.sh split hostN  link down only: the host and its processes live on,
#                              cut off (a split network, no FIN/RST either way).
#   netns_host.sh heal hostN   link up again after a split.
set -euo pipefail
DIR=${DSL_INFRA_DIR:-/run/dslaunch-infra}
SDIR=${DSL_SLURM_DIR:-/run/dslaunch-slurm}
op=$1; h=$2
i=${h##*[!0-9]}; ns="dsl-$h"; v="dsl-v$i"
ip netns list | grep -q "^$ns\b" || { echo "no such fake host: $h" >&2; exit 1; }
case $op in
  down)
    ip link set "$v" down
    pids=$(ip netns pids "$ns" || true)
    [ -n "$pids" ] && kill -9 $pids 2>/dev/null || true
    for _ in $(seq 1 50); do [ -z "$(ip netns pids "$ns")" ] && break; sleep 0.1; done
    ;;
  up)
    ip link set "$v" up
    hide=$(cat "$DIR/bare-$h" 2>/dev/null || true)
    ip netns exec "$ns" unshare --uts sh -c \
      "${hide}hostname $h && exec /usr/sbin/sshd -f $DIR/sshd_config -o PidFile=$DIR/sshd-$h.pid -E $DIR/sshd-$h.log"
    if [ -f "$SDIR/mode" ] && [ "$(cat "$SDIR/mode")" = netns ]; then
      nsenter --net="/run/netns/$ns" unshare --uts sh -c "hostname $h && exec slurmd -N $h"
    fi
    for _ in $(seq 1 50); do
      [ "$(ssh "$h" hostname 2>/dev/null)" = "$h" ] && exit 0
      sleep 0.1
    done
    echo "sshd on $h not answering after revive" >&2; exit 1
    ;;
  split) ip link set "$v" down ;;
  heal) ip link set "$v" up ;;
  *) echo "usage: $0 down|up|split|heal hostN" >&2; exit 2 ;;
esac
