#!/usr/bin/env bash
# tests/ops/lab.sh - the throw-away cluster the ops tests run against, all on this one host:
#
#   lab.sh docker-up    dockerd (API on a unix socket under $LAB, no bridge, no iptables) and the
#                       image uccl-ep-ops/debian:bookworm built from a debootstrap root file system
#   lab.sh slurm-up     munged + slurmctld + 2 slurmd ("node1" 127.0.0.11, "node2" 127.0.0.12), each
#                       with a fake gres gpu:8, plus a SPANK stub that accepts pyxis' --container-* flags
#   lab.sh ray-up       a Ray head on 127.0.0.2 and a worker on 127.0.0.3 (8 fake GPUs each)
#   lab.sh down         stop everything above that runs under $LAB (by pid file), unmount leftovers
#   lab.sh env          print the exports clients need (DOCKER_HOST, SLURM_CONF, RAY_ADDRESS)
#
# Settings: LAB (required: a scratch directory, keep it short: unix socket paths), OPS_RAY (ray
# executable; default .venv-ops/bin/ray), OPS_CACHE (where the debootstrap tarball is kept between
# runs; default ~/.cache/uccl-ep-ops), DEBIAN_ARCHIVE, and the ports below.
#
# NOTES: every wait is bounded (wait_until), every daemon writes a pid file under $LAB and `down`
# stops exactly those pids, so two labs (or other tests' daemons) never kill each other's processes.
# Ports are chosen away from the defaults (6379, 6817, 8265...) for the same reason.
set -euo pipefail

: "${LAB:?set LAB to a scratch directory}"
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
OPS_RAY=${OPS_RAY:-$ROOT/.venv-ops/bin/ray}
OPS_CACHE=${OPS_CACHE:-$HOME/.cache/uccl-ep-ops}
SLURMCTLD_PORT=${SLURMCTLD_PORT:-26817}
SLURMD_PORT_BASE=${SLURMD_PORT_BASE:-27000}
RAY_PORT=${RAY_PORT:-26379}
RAY_DASHBOARD_PORT=${RAY_DASHBOARD_PORT:-28265}
RAY_HEAD_IP=127.0.0.2
RAY_WORKER_IP=127.0.0.3
BASE_TAG=uccl-ep-ops/debian:bookworm
SL=$LAB/slurm

say() { printf '[lab] %s\n' "$*" >&2; }
fail() { say "ERROR: $*"; exit 1; }

# wait_until SECONDS WHAT CMD...: poll CMD every 0.5 s; fail with WHAT when the time is up, or at
# once when the process in $WATCH_PID (if set) has died.
wait_until() {
  local secs=$1 what=$2 end
  shift 2
  end=$((SECONDS + secs))
  while ((SECONDS < end)); do
    if timeout 20 "$@" >/dev/null 2>&1; then return 0; fi
    if [[ -n ${WATCH_PID:-} ]] && ! kill -0 "$WATCH_PID" 2>/dev/null; then fail "$what: the process exited"; fi
    sleep 0.5
  done
  fail "gave up after ${secs}s waiting for $what"
}

alive() { [[ -f $1 ]] && kill -0 "$(cat "$1")" 2>/dev/null; }

# stop_pidfile FILE [GROUP]: TERM, wait up to 20 s, then KILL; GROUP=1 also signals the process group.
stop_pidfile() {
  local f=$1 group=${2:-0} pid i
  [[ -f $f ]] || return 0
  pid=$(cat "$f")
  if [[ $pid =~ ^[0-9]+$ ]] && kill -0 "$pid" 2>/dev/null; then
    kill -TERM "$pid" 2>/dev/null || true
    for i in $(seq 40); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
    if ((group)); then kill -TERM -- "-$pid" 2>/dev/null || true; sleep 0.5; kill -KILL -- "-$pid" 2>/dev/null || true; fi
    kill -KILL "$pid" 2>/dev/null || true
  fi
  rm -f "$f"
}

# ---------------------------------------------------------------------------------------------
debian_archive() {  # the host's own Debian mirror (deb822 or one-line sources), else debootstrap's default
  local f
  if [[ -n ${DEBIAN_ARCHIVE:-} ]]; then echo "$DEBIAN_ARCHIVE"; return; fi
  for f in /etc/apt/sources.list.d/*.sources; do
    [[ -f $f ]] && awk '/^URIs:/ && $2 !~ /security/ {print $2; exit}' "$f"
  done | head -n1
}

docker_up() {
  mkdir -p "$LAB/docker/data" "$LAB/docker/exec" "$OPS_CACHE"
  if ! alive "$LAB/dockerd.pid"; then
    rm -f "$LAB/docker.sock"
    # NOTES: no bridge and no iptables: tests build and run with --network host, and this way the
    # daemon leaves no docker0 link or NAT rules behind, and cannot clash with another dockerd.
    setsid dockerd --data-root "$LAB/docker/data" --exec-root "$LAB/docker/exec" \
      -H "unix://$LAB/docker.sock" --pidfile "$LAB/dockerd.pid" --bridge none --iptables=false \
      --ip-masq=false >"$LAB/dockerd.log" 2>&1 </dev/null &
    wait_until 60 "dockerd (see $LAB/dockerd.log)" test -S "$LAB/docker.sock"
  fi
  export DOCKER_HOST=unix://$LAB/docker.sock
  wait_until 30 "the docker API" docker version
  if ! docker image inspect "$BASE_TAG" >/dev/null 2>&1; then
    local tarball=$OPS_CACHE/debian-bookworm-minbase.tar archive
    if [[ ! -s $tarball ]]; then
      archive=$(debian_archive)
      say "debootstrap bookworm (${archive:-default mirror})"
      rm -rf "$LAB/rootfs"
      timeout 900 debootstrap --variant=minbase bookworm "$LAB/rootfs" ${archive:+"$archive"} \
        >"$LAB/debootstrap.log" 2>&1 || fail "debootstrap failed, see $LAB/debootstrap.log"
      tar -C "$LAB/rootfs" -cf "$tarball.tmp" . && mv "$tarball.tmp" "$tarball"
      rm -rf "$LAB/rootfs"
    fi
    timeout 300 docker import "$tarball" "$BASE_TAG" >/dev/null
  fi
  say "docker ready: $(docker version --format '{{.Server.Version}}'), base image $BASE_TAG"
}

# ---------------------------------------------------------------------------------------------
write_spank_stub() {  # accepts pyxis' flags, hands them to tasks as PYXIS_STUB_* (tests assert on them)
  cat >"$SL/pyxis_stub.c" <<'C'
#include <slurm/spank.h>
#include <stdlib.h>
#include <string.h>
SPANK_PLUGIN(pyxis_stub, 1);
static const char *names[] = {"PYXIS_STUB_IMAGE", "PYXIS_STUB_MOUNTS", "PYXIS_STUB_WORKDIR",
                              "PYXIS_STUB_NAME", "PYXIS_STUB_WRITABLE", "PYXIS_STUB_REMAP_ROOT"};
static char *seen[6];
static int keep(int i, const char *arg, int remote) {
  (void)remote;
  free(seen[i]);
  seen[i] = strdup(arg ? arg : "1");
  return 0;
}
static struct spank_option opts[] = {
  {"container-image", "IMAGE", "pyxis stub", 1, 0, keep},
  {"container-mounts", "MOUNTS", "pyxis stub", 1, 1, keep},
  {"container-workdir", "DIR", "pyxis stub", 1, 2, keep},
  {"container-name", "NAME", "pyxis stub", 1, 3, keep},
  {"container-writable", NULL, "pyxis stub", 0, 4, keep},
  {"container-remap-root", NULL, "pyxis stub", 0, 5, keep},
  SPANK_OPTIONS_TABLE_END};
int slurm_spank_init(spank_t sp, int ac, char **av) {
  (void)ac; (void)av;
  for (int i = 0; opts[i].name; i++)
    if (spank_option_register(sp, &opts[i]) != ESPANK_SUCCESS) return -1;
  return 0;
}
int slurm_spank_task_init(spank_t sp, int ac, char **av) {
  (void)ac; (void)av;
  for (int i = 0; i < 6; i++)
    if (seen[i]) spank_setenv(sp, names[i], seen[i], 1);
  return 0;
}
C
  gcc -shared -fPIC -O2 -o "$SL/pyxis_stub.so" "$SL/pyxis_stub.c"
  echo "required $SL/pyxis_stub.so" >"$SL/plugstack.conf"
}

write_slurm_conf() {
  local host=$1 i
  {
    echo "ClusterName=ucclops"
    echo "SlurmctldHost=$host(127.0.0.1)"
    echo "SlurmctldPort=$SLURMCTLD_PORT"
    echo "AuthType=auth/munge"
    echo "AuthInfo=socket=$SL/munge/munge.sock"
    echo "CredType=cred/munge"
    echo "SlurmUser=root"
    echo "SlurmdUser=root"
    echo "StateSaveLocation=$SL/state"
    echo "SlurmdSpoolDir=$SL/spool/%n"
    echo "TmpFS=$SL/tmp/%n"
    echo "SlurmctldPidFile=$SL/slurmctld.pid"
    echo "SlurmdPidFile=$SL/slurmd.%n.pid"
    echo "SlurmctldLogFile=$SL/log/slurmctld.log"
    echo "SlurmdLogFile=$SL/log/slurmd.%n.log"
    echo "PlugStackConfig=$SL/plugstack.conf"
    echo "ProctrackType=proctrack/linuxproc"
    echo "TaskPlugin=task/none"
    echo "SelectType=select/cons_tres"
    echo "SelectTypeParameters=CR_Core"
    echo "MpiDefault=none"
    echo "ReturnToService=2"
    echo "GresTypes=gpu"
    echo "AccountingStorageType=accounting_storage/none"
    echo "JobCompType=jobcomp/none"
    echo "InactiveLimit=0"
    echo "KillWait=5"
    echo "MinJobAge=300"
    for i in 1 2; do
      echo "NodeName=node$i NodeHostname=$host NodeAddr=127.0.0.$((10 + i)) Port=$((SLURMD_PORT_BASE + i)) CPUs=$(nproc) RealMemory=4000 Gres=gpu:8 State=UNKNOWN"
    done
    # MaxTime caps every lab job at 15 minutes, whatever the script asks for.
    echo "PartitionName=debug Nodes=ALL Default=YES MaxTime=15 State=UP OverSubscribe=FORCE:8"
  } >"$SL/slurm.conf"
  echo "Name=gpu File=$SL/dev/gpu[0-7]" >"$SL/gres.conf"
}

slurm_up() {
  local host i
  host=$(hostname)
  mkdir -p "$SL"/{state,log,munge,dev} "$SL"/spool/node{1,2} "$SL"/tmp/node{1,2}
  chmod 700 "$SL/munge"
  # gres needs character devices: aliases of /dev/null stand in for GPUs.
  for i in 0 1 2 3 4 5 6 7; do [[ -c $SL/dev/gpu$i ]] || mknod "$SL/dev/gpu$i" c 1 3; done
  write_spank_stub
  write_slurm_conf "$host"
  export SLURM_CONF=$SL/slurm.conf
  if [[ ! -f $SL/munge/munge.key ]]; then
    head -c 1024 /dev/urandom >"$SL/munge/munge.key"
    chmod 400 "$SL/munge/munge.key"
  fi
  if ! alive "$SL/munge/munged.pid"; then
    rm -f "$SL/munge/munge.sock"
    munged --force --socket="$SL/munge/munge.sock" --key-file="$SL/munge/munge.key" \
      --log-file="$SL/log/munged.log" --pid-file="$SL/munge/munged.pid" --seed-file="$SL/munge/munged.seed"
    wait_until 20 "munged" test -S "$SL/munge/munge.sock"
  fi
  alive "$SL/slurmctld.pid" || slurmctld -i
  wait_until 30 "slurmctld (see $SL/log/slurmctld.log)" scontrol ping
  for i in 1 2; do alive "$SL/slurmd.node$i.pid" || slurmd -N "node$i"; done
  wait_until 40 "2 idle slurm nodes" bash -c '[[ $(sinfo -h -t idle -o %D) == 2 ]]'
  say "slurm ready: $(sinfo -h -N -o '%N=%T' | tr '\n' ' ')"
}

# ---------------------------------------------------------------------------------------------
ray_up() {
  [[ -x $OPS_RAY ]] || fail "no ray at $OPS_RAY (ci/setup.d/50-ops.sh installs it)"
  export RAY_USAGE_STATS_ENABLED=0
  mkdir -p "$LAB/ray"
  # NOTES: Ray rewrites 127.0.0.1 to the host's outward address, so the nodes use .2 and .3. The
  # head runs the dashboard: `uccl-ep launch ray --address http://HEAD:PORT` submits through Ray's
  # job API, which the dashboard serves (about 1 GB of memory in all with the head here).
  if ! alive "$LAB/ray-head.pid"; then
    setsid "$OPS_RAY" start --block --head --node-ip-address=$RAY_HEAD_IP --port="$RAY_PORT" \
      --num-cpus=2 --num-gpus=8 --include-dashboard=true --dashboard-host=$RAY_HEAD_IP \
      --dashboard-port="$RAY_DASHBOARD_PORT" \
      --disable-usage-stats --temp-dir="$LAB/ray" >"$LAB/ray-head.log" 2>&1 </dev/null &
    echo $! >"$LAB/ray-head.pid"
    WATCH_PID=$(cat "$LAB/ray-head.pid") wait_until 300 "the Ray head (see $LAB/ray-head.log)" "$OPS_RAY" status --address "$RAY_HEAD_IP:$RAY_PORT"
    WATCH_PID=$(cat "$LAB/ray-head.pid") wait_until 120 "the Ray dashboard (see $LAB/ray-head.log)" \
      "$(dirname "$OPS_RAY")/python" -c "import urllib.request as u; u.urlopen('http://$RAY_HEAD_IP:$RAY_DASHBOARD_PORT/api/version', timeout=10)"
  fi
  if ! alive "$LAB/ray-worker.pid"; then
    setsid "$OPS_RAY" start --block --address="$RAY_HEAD_IP:$RAY_PORT" --node-ip-address=$RAY_WORKER_IP \
      --num-cpus=2 --num-gpus=8 --disable-usage-stats >"$LAB/ray-worker.log" 2>&1 </dev/null &
    echo $! >"$LAB/ray-worker.pid"
    WATCH_PID=$(cat "$LAB/ray-worker.pid") wait_until 300 "the Ray worker to join (see $LAB/ray-worker.log)" \
      bash -c "'$OPS_RAY' status --address '$RAY_HEAD_IP:$RAY_PORT' | grep -q '/16.0 GPU'"
  fi
  say "ray ready: head $RAY_HEAD_IP:$RAY_PORT (jobs: http://$RAY_HEAD_IP:$RAY_DASHBOARD_PORT), worker $RAY_WORKER_IP"
}

unmount_under_lab() {
  awk -v p="$LAB/" 'index($2, p) == 1 {print $2}' /proc/mounts | sort -r | while read -r m; do
    umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || true
  done
}

down() {
  local f
  stop_pidfile "$LAB/ray-worker.pid" 1
  stop_pidfile "$LAB/ray-head.pid" 1
  for f in "$SL"/slurmd.*.pid; do [[ -e $f ]] && stop_pidfile "$f"; done
  stop_pidfile "$SL/slurmctld.pid"
  stop_pidfile "$SL/munge/munged.pid"
  if alive "$LAB/dockerd.pid"; then
    DOCKER_HOST=unix://$LAB/docker.sock timeout 30 docker ps -aq 2>/dev/null |
      xargs -r env DOCKER_HOST="unix://$LAB/docker.sock" timeout 30 docker rm -f >/dev/null 2>&1 || true
  fi
  stop_pidfile "$LAB/dockerd.pid"
  unmount_under_lab
  rm -f "$LAB/docker.sock" "$SL/munge/munge.sock"
  say "down"
}

case ${1:-} in
  docker-up) docker_up ;;
  slurm-up) slurm_up ;;
  ray-up) ray_up ;;
  down) down ;;
  env) echo "export DOCKER_HOST=unix://$LAB/docker.sock SLURM_CONF=$SL/slurm.conf RAY_ADDRESS=$RAY_HEAD_IP:$RAY_PORT" ;;
  *) sed -n '2,16p' "$0"; exit 2 ;;
esac
