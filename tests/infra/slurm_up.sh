#!/usr/bin/env bash
# Real SLURM (Debian slurm-wlm 22.05) + munge on this machine, no systemd.
#
#   bash tests/infra/slurm_up.sh           # single node = this machine
#   DSL_SLURM_MODE=netns bash infra/slurm_up.sh
#        # multi-node: one slurmd per fake host from netns_ssh_up.sh
#        # (run that first); slurmctld listens on dsl-head (198.51.100.1)
#   DSL_SLURM_CGROUP=1 ...                 # use proctrack/cgroup + task/cgroup
#   bash infra/slurm_down.sh
#
# Then: sinfo; srun -N1 -n2 hostname; sbatch --wrap 'hostname'; squeue; scancel.
# Daemons run as root (SlurmUser=root) to avoid spool-dir ownership chores.
set -euo pipefail
MODE=${DSL_SLURM_MODE:-single}
CGROUP=${DSL_SLURM_CGROUP:-0}
DIR=${DSL_SLURM_DIR:-/run/dslaunch-slurm}
CONF=/etc/slurm/slurm.conf
t0=$(date +%s%N)
ms() { echo $(( ($(date +%s%N) - t0) / 1000000 )); }

[ "$(id -u)" = 0 ] || { echo "must run as root" >&2; exit 1; }
if ! command -v slurmctld >/dev/null || ! command -v slurmd >/dev/null || ! command -v munged >/dev/null; then
  apt-get update -qq
  # policy-rc.d / no systemd: the packages' own services do not start. Good.
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends slurm-wlm munge >/dev/null
  echo "slurm_up: packages installed at $(ms) ms"
fi
[ -d "$DIR" ] && { echo "$DIR exists; run slurm_down.sh first" >&2; exit 1; }
mkdir -p "$DIR"/{ctld,log}
echo "$MODE" > "$DIR/mode"
[ -f "$CONF" ] && [ ! -f "$CONF.dsl-orig" ] && cp "$CONF" "$CONF.dsl-orig"

# --- munge ------------------------------------------------------------------
# The package creates /etc/munge/munge.key; make one if it is missing.
if [ ! -s /etc/munge/munge.key ]; then
  dd if=/dev/urandom of=/etc/munge/munge.key bs=1 count=1024 status=none
  chown munge:munge /etc/munge/munge.key; chmod 400 /etc/munge/munge.key
fi
mkdir -p /run/munge /var/log/munge /var/lib/munge
chown munge:munge /run/munge /var/log/munge /var/lib/munge
chmod 755 /run/munge
runuser -u munge -- /usr/sbin/munged --pid-file=/run/munge/munged.pid
for _ in $(seq 1 50); do munge -n </dev/null | unmunge >/dev/null 2>&1 && break; sleep 0.1; done
munge -n </dev/null | unmunge >/dev/null
echo "slurm_up: munged up at $(ms) ms"

# --- slurm.conf ---------------------------------------------------------------
if [ "$CGROUP" = 1 ]; then
  PROCTRACK=proctrack/cgroup; TASK=task/cgroup,task/affinity
  cat > /etc/slurm/cgroup.conf <<EOF
CgroupPlugin=autodetect
ConstrainCores=no
ConstrainRAMSpace=no
EOF
else
  # no cgroups at all: works in containers / VMs without a cgroup hierarchy
  PROCTRACK=proctrack/linuxproc; TASK=task/none
fi

if [ "$MODE" = netns ]; then
  # shellcheck disable=SC1091
  . /run/dslaunch-infra/env.sh || { echo "run netns_ssh_up.sh first" >&2; exit 1; }
  # SlurmctldHost's name must be this machine's `hostname -s` (else "This
  # host not a valid controller"); its address is the bridge IP the
  # namespaced slurmds can reach.
  CTLD_HOST=$(hostname -s); CTLD_ADDR="$DSL_HEAD_IP"
  NODES=""; NODELIST=""
  for h in $DSL_HOSTS; do
    NODES+="NodeName=$h NodeAddr=$(getent hosts "$h" | awk '{print $1}') CPUs=2 RealMemory=2000 State=UNKNOWN"$'\n'
    NODELIST+="${NODELIST:+,}$h"
  done
else
  CTLD_HOST=$(hostname -s); CTLD_ADDR=127.0.0.1
  NODES="NodeName=$CTLD_HOST NodeAddr=127.0.0.1 CPUs=$(nproc) RealMemory=2000 State=UNKNOWN"$'\n'
  NODELIST=$CTLD_HOST
fi

cat > "$CONF" <<EOF
# written by dslaunch infra/slurm_up.sh
ClusterName=dsl
SlurmctldHost=${CTLD_HOST}(${CTLD_ADDR})
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
SlurmctldPort=6817
SlurmdPort=6818
StateSaveLocation=$DIR/ctld
SlurmdSpoolDir=$DIR/slurmd-%n
SlurmctldPidFile=$DIR/slurmctld.pid
SlurmdPidFile=$DIR/slurmd-%n.pid
SlurmctldLogFile=$DIR/log/slurmctld.log
SlurmdLogFile=$DIR/log/slurmd-%n.log
ProctrackType=$PROCTRACK
TaskPlugin=$TASK
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
MailProg=/bin/true
ReturnToService=2
# fast scheduling for tests
SchedulerParameters=defer_batch=0
MessageTimeout=10
SlurmdTimeout=30
InactiveLimit=0
KillWait=2
MinJobAge=30
$NODES
PartitionName=debug Nodes=$NODELIST Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
EOF

# --- daemons -------------------------------------------------------------------
# SlurmdSpoolDir is not created by slurmd before it opens its socket there
for n in $(echo "$NODELIST" | tr ',' ' '); do mkdir -p "$DIR/slurmd-$n"; done
# -i: ignore saved state (fresh cluster every time)
slurmctld -i
if [ "$MODE" = netns ]; then
  for h in $DSL_HOSTS; do
    # slurmd inside the fake host's network namespace; own UTS name = node
    # name. nsenter, NOT `ip netns exec`: the latter remounts /sys in a new
    # mount namespace, hiding /sys/fs/cgroup, and slurmd 22.05 then dies with
    # "No filesystem mounted on /sys/fs/cgroup" even with proctrack/linuxproc.
    nsenter --net="/run/netns/dsl-$h" unshare --uts sh -c "hostname $h && exec slurmd -N $h"
  done
else
  slurmd
fi

# wait until every node is idle
for _ in $(seq 1 300); do
  if sinfo -h -o '%T' 2>/dev/null | grep -qvE '^idle$'; then sleep 0.1; continue; fi
  [ -n "$(sinfo -h -o '%T' 2>/dev/null)" ] && break
  sleep 0.1
done
sinfo -h -o '%N %T' | grep -q idle || { echo "nodes not idle:"; sinfo; tail -20 "$DIR"/log/*.log; exit 1; } >&2
echo "slurm_up: cluster idle ($MODE, $PROCTRACK/$TASK) at $(ms) ms"
sinfo
