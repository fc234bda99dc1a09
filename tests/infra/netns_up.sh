#!/usr/bin/env bash
# Create N fake "hosts" on this machine: one network namespace each (own IP,
# own UTS hostname), joined by a Linux bridge that the main namespace is also
# on, with an OpenSSH server in each namespace accepting key-based root login.
#
#   bash tests/infra/netns_up.sh                # 2 hosts: host1, host2
#   DSL_NODES=3 DSL_BARE_HOSTS=host3 bash tests/infra/netns_up.sh
#        # host3's sshd runs in a private mount namespace where DSL_HIDE_PATH
#        # (the venv's site-packages) is covered by an empty tmpfs: a host on
#        # which python exists but dslaunch (and torch) are not installed.
#   bash tests/infra/netns_down.sh              # tears everything down
#   bash tests/infra/netns_host.sh down|up hostN  # silent host loss / revive
#
# After it:  ssh host1 hostname   -> host1      (no flags needed)
#            pdsh -R ssh -w host[1-3] hostname
# Files written to $DSL_INFRA_DIR: id_ed25519(.pub), hostfile, env.sh, logs.
#
# Network safety: addresses come from TEST-NET-2 (198.51.100.0/24) by default,
# which must NOT be in use on this machine (the script refuses if it is). An
# "unreachable" guard route for the subnet is installed first so that nothing
# aimed at these addresses can ever leave via the default route, even if a
# later step fails. Namespaces get no default route.
set -euo pipefail

N=${DSL_NODES:-2}
BARE=" ${DSL_BARE_HOSTS:-} "
HIDE=${DSL_HIDE_PATH:-}
NET=${DSL_NET:-198.51.100}          # /24 prefix, first three octets
PREFIX=${DSL_HOST_PREFIX:-host}     # hostnames: host1..hostN
PORT=${DSL_SSH_PORT:-22}
DIR=${DSL_INFRA_DIR:-/run/dslaunch-infra}
BR=dsl-br0
MARK="dslaunch-infra"
t0=$(date +%s%N)

[ "$(id -u)" = 0 ] || { echo "must run as root" >&2; exit 1; }

need=()
command -v sshd >/dev/null || [ -x /usr/sbin/sshd ] || need+=(openssh-server)
command -v ssh >/dev/null || need+=(openssh-client)
command -v ip >/dev/null || need+=(iproute2)
command -v unshare >/dev/null || need+=(util-linux)
[ "${DSL_INSTALL_PDSH:-1}" = 1 ] && ! command -v pdsh >/dev/null && need+=(pdsh)
if [ ${#need[@]} -gt 0 ]; then
  # policy-rc.d (if present) keeps the package's own sshd from starting; fine.
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi

if ip netns list | grep -q "^dsl-${PREFIX}"; then
  echo "namespaces already exist; run netns_ssh_down.sh first" >&2; exit 1
fi
# Refuse if the subnet is already in use on this machine (e.g. it is eth0's).
if ip -4 addr show | grep -q "inet ${NET}\."; then
  echo "subnet ${NET}.0/24 is already assigned on this machine; set DSL_NET" >&2; exit 1
fi
if ip -4 route show | grep -q "^${NET}\.0/24" ; then
  echo "a route for ${NET}.0/24 already exists; set DSL_NET or run down" >&2; exit 1
fi

mkdir -p "$DIR" /run/sshd
chmod 700 "$DIR"

# 1. guard route, bridge, main-namespace address
ip route add unreachable "${NET}.0/24" metric 4242
ip link add "$BR" type bridge
ip addr add "${NET}.1/24" dev "$BR"
ip link set "$BR" up

# 2. keys and sshd config
ssh-keygen -q -t ed25519 -N '' -C "$MARK-client" -f "$DIR/id_ed25519"
ssh-keygen -q -t ed25519 -N '' -C "$MARK-host" -f "$DIR/ssh_host_ed25519_key"
cp "$DIR/id_ed25519.pub" "$DIR/authorized_keys"
chmod 600 "$DIR/authorized_keys"
cat > "$DIR/sshd_config" <<EOF
Port $PORT
ListenAddress 0.0.0.0
HostKey $DIR/ssh_host_ed25519_key
AuthorizedKeysFile $DIR/authorized_keys
PermitRootLogin prohibit-password
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
# launchers open many connections at once (default 10:30:100 drops some)
MaxStartups 256
MaxSessions 256
# let clients pass environment variables with ssh -o SendEnv=...
AcceptEnv *
PermitUserEnvironment yes
X11Forwarding no
PrintMotd no
Subsystem sftp /usr/lib/openssh/sftp-server
EOF

hosts=()
for i in $(seq 1 "$N"); do hosts+=("${PREFIX}${i}"); done

# 3. /etc/hosts block (rewritten in place: /etc/hosts may be a bind mount)
tmp=$(mktemp)
sed "/^# BEGIN $MARK\$/,/^# END $MARK\$/d" /etc/hosts > "$tmp"
{
  echo "# BEGIN $MARK"
  echo "${NET}.1 dsl-head"
  for i in $(seq 1 "$N"); do echo "${NET}.$((10 + i)) ${PREFIX}${i}"; done
  echo "# END $MARK"
} >> "$tmp"
cat "$tmp" > /etc/hosts; rm -f "$tmp"

# 4. ssh client config, included from the top of /root/.ssh/config
cat > "$DIR/ssh_config" <<EOF
Host ${hosts[*]} dsl-head ${NET}.*
    User root
    Port $PORT
    IdentityFile $DIR/id_ed25519
    IdentitiesOnly yes
    StrictHostKeyChecking no
    UserKnownHostsFile /dev/null
    LogLevel ERROR
    BatchMode yes
    ConnectTimeout 5
EOF
mkdir -p /root/.ssh; chmod 700 /root/.ssh
touch /root/.ssh/config
tmp=$(mktemp)
{
  echo "# BEGIN $MARK"
  echo "Include $DIR/ssh_config"
  echo "# END $MARK"
  sed "/^# BEGIN $MARK\$/,/^# END $MARK\$/d" /root/.ssh/config
} > "$tmp"
cat "$tmp" > /root/.ssh/config; rm -f "$tmp"
chmod 600 /root/.ssh/config

# 5. namespaces, veths, sshd per namespace (own UTS namespace => own hostname)
for i in $(seq 1 "$N"); do
  ns="dsl-${PREFIX}${i}"; h="${PREFIX}${i}"; ip_="${NET}.$((10 + i))"
  ip netns add "$ns"
  ip link add "dsl-v$i" type veth peer name eth0 netns "$ns"
  ip link set "dsl-v$i" master "$BR"
  ip link set "dsl-v$i" up
  ip -n "$ns" link set lo up
  ip -n "$ns" addr add "${ip_}/24" dev eth0
  ip -n "$ns" link set eth0 up
  hide=""
  if [ "${BARE#* $h }" != "$BARE" ] && [ -n "$HIDE" ]; then
    # `ip netns exec` runs in its own (slave) mount namespace: this mount is
    # seen only by this host's sshd and what it starts.
    hide="mount -t tmpfs -o size=1m dsl-bare $HIDE && "
  fi
  ip netns exec "$ns" unshare --uts sh -c \
    "${hide}hostname $h && exec /usr/sbin/sshd -f $DIR/sshd_config -o PidFile=$DIR/sshd-$h.pid -E $DIR/sshd-$h.log"
  echo "$hide" > "$DIR/bare-$h"
done

# 6. hostfiles / env for tests
printf '%s\n' "${hosts[@]}" > "$DIR/hostfile"
for h in "${hosts[@]}"; do echo "$h slots=2"; done > "$DIR/hostfile.openmpi"
cat > "$DIR/env.sh" <<EOF
export DSL_INFRA_DIR=$DIR
export DSL_HOSTS="${hosts[*]}"
export DSL_HEAD_IP=${NET}.1
export DSL_SSH_KEY=$DIR/id_ed25519
export DSL_SSH_PORT=$PORT
export PDSH_RCMD_TYPE=ssh
EOF

# 7. sanity: route goes via the bridge, and every sshd answers
for i in $(seq 1 "$N"); do
  ip route get "${NET}.$((10 + i))" | grep -q "dev $BR" || { echo "route check failed" >&2; exit 1; }
done
for h in "${hosts[@]}"; do
  ok=0
  for _ in $(seq 1 50); do
    if out=$(ssh "$h" hostname 2>/dev/null) && [ "$out" = "$h" ]; then ok=1; break; fi
    sleep 0.1
  done
  [ $ok = 1 ] || { echo "sshd on $h not answering; see $DIR/sshd-$h.log" >&2; exit 1; }
done
t1=$(date +%s%N)
echo "netns_ssh_up: ${hosts[*]} ready in $(( (t1 - t0) / 1000000 )) ms; source $DIR/env.sh"
