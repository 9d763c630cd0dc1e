#!/usr/bin/env bash
# Start / stop the services the integration tests use, on this machine (Debian, as root):
#   source .ci/services.sh up DIR   -> PostgreSQL on 127.0.0.1 and a single-node Slurm (slurmctld + slurmd,
#                                      munge), state in DIR; exports AUTOTUNE_TEST_POSTGRES_URL and SLURM_CONF
#                                      (+ AUTOTUNE_TEST_SLURM=1) for tests/test_workers_services.py
#   .ci/services.sh down DIR        -> stop what `up` started, by the pid files in DIR (nothing else)
# How the single-node Slurm is set up: shared/reference/single-node-slurm.md (slurm-wlm 22.05, Debian 12).
# A service that cannot start is reported and its variable left unset (its tests then skip, saying why).
set -uo pipefail

_free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

_apt() {  # install the Debian packages that are missing (once per machine)
  local missing=()
  for p in "$@"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
  [ ${#missing[@]} -eq 0 ] && return 0
  echo "services: apt-get install ${missing[*]}"
  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}") >/dev/null 2>&1
}

_pg_bin() { ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1; }

pg_up() {
  local dir=$1/pg; _apt postgresql || { echo "services: postgresql could not be installed"; return 1; }
  local bin; bin=$(_pg_bin); [ -n "$bin" ] || { echo "services: no PostgreSQL binaries"; return 1; }
  mkdir -p "$dir" && chown postgres:postgres "$dir"
  local port; port=$(_free_port)
  runuser -u postgres -- "$bin/initdb" -D "$dir/data" -A trust -U postgres >"$dir/initdb.log" 2>&1 || {
    echo "services: initdb failed: $(tail -n 3 "$dir/initdb.log")"; return 1; }
  runuser -u postgres -- "$bin/pg_ctl" -D "$dir/data" -l "$dir/server.log" -w -t 60 \
    -o "-h 127.0.0.1 -p $port -k $dir -c max_connections=200 -c fsync=off" start >/dev/null || {
    echo "services: postgres did not start: $(tail -n 3 "$dir/server.log")"; return 1; }
  runuser -u postgres -- "$bin/createdb" -h 127.0.0.1 -p "$port" autotune_test || return 1
  export AUTOTUNE_TEST_POSTGRES_URL="postgresql://postgres@127.0.0.1:$port/autotune_test"
  # how a test restarts the server (tests/test_workers_services.py, issue 25: a restart during --workers 4)
  export AUTOTUNE_TEST_POSTGRES_RESTART="runuser -u postgres -- $bin/pg_ctl -D $dir/data -l $dir/server.log -m fast -w -t 60 restart"
  echo "services: PostgreSQL on 127.0.0.1:$port ($AUTOTUNE_TEST_POSTGRES_URL)"
}

pg_down() {
  local dir=$1/pg bin; bin=$(_pg_bin)
  [ -f "$dir/data/postmaster.pid" ] && runuser -u postgres -- "$bin/pg_ctl" -D "$dir/data" -m fast -w stop >/dev/null
  return 0
}

slurm_up() {
  local dir=$1/slurm; _apt slurm-wlm munge || { echo "services: slurm-wlm/munge could not be installed"; return 1; }
  mkdir -p "$dir"/{state,spool,log} /run/munge && chown munge:munge /run/munge
  [ -f /etc/munge/munge.key ] || { echo "services: /etc/munge/munge.key missing"; return 1; }
  runuser -u munge -- /usr/sbin/munged --force --pid-file=/run/munge/autotune-ci-munged.pid 2>"$dir/log/munged.err" \
    || { echo "services: munged did not start: $(cat "$dir/log/munged.err")"; return 1; }
  cp /run/munge/autotune-ci-munged.pid "$dir/munged.pid" 2>/dev/null
  sleep 1
  munge -n | unmunge >/dev/null 2>&1 || { echo "services: munge does not authenticate"; return 1; }
  local host cpus mem cport dport
  host=$(hostname -s); cpus=$(nproc); mem=$(( $(free -m | awk '/^Mem:/{print $7}') * 8 / 10 ))
  cport=$(_free_port); dport=$(_free_port)
  cat >"$dir/slurm.conf" <<CONF
ClusterName=autotune-ci
SlurmctldHost=$host
AuthType=auth/munge
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SlurmUser=root
SlurmdUser=root
SlurmctldPort=$cport
SlurmdPort=$dport
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd.log
ReturnToService=2
MinJobAge=600
KillWait=5
MpiDefault=none
NodeName=$host CPUs=$cpus RealMemory=$mem State=UNKNOWN
PartitionName=debug Nodes=$host Default=YES MaxTime=INFINITE State=UP
CONF
  export SLURM_CONF=$dir/slurm.conf
  slurmctld -f "$SLURM_CONF" || { echo "services: slurmctld did not start"; return 1; }
  slurmd -f "$SLURM_CONF" || { echo "services: slurmd did not start"; return 1; }
  local i
  for i in $(seq 1 30); do
    sinfo -h -o %T 2>/dev/null | grep -q idle && break
    sleep 1
  done
  sinfo -h -o %T 2>/dev/null | grep -q idle || { echo "services: the Slurm node is not idle: $(sinfo 2>&1 | tail -n 2)"; return 1; }
  export AUTOTUNE_TEST_SLURM=1
  echo "services: single-node Slurm up (SLURM_CONF=$SLURM_CONF)"
}

slurm_down() {
  local dir=$1/slurm f
  for f in slurmd slurmctld munged; do
    [ -f "$dir/$f.pid" ] && kill "$(cat "$dir/$f.pid")" 2>/dev/null
  done
  return 0
}

case "${1:-}" in
  up)   mkdir -p "$2"; chmod 755 "$2"; pg_up "$2" || true; slurm_up "$2" || true ;;
  down) slurm_down "$2"; pg_down "$2" ;;
  *)    echo "usage: source .ci/services.sh up DIR | .ci/services.sh down DIR" >&2 ;;
esac
