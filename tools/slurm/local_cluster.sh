#!/usr/bin/env bash
# A one-node Slurm cluster on this machine, for trying Loom's sbatch script (tests/slurm).
#   tools/slurm/local_cluster.sh start DIR   munged, slurmctld and slurmd with everything under DIR
#   tools/slurm/local_cluster.sh stop DIR    stops them (DIR stays, with the daemons' logs)
# Needs root (slurmd runs jobs as their user) and Debian's slurmctld, slurmd, slurm-client and
# munge. Nothing under /etc is changed: the daemons and the clients read DIR/slurm.conf through
# SLURM_CONF (export it: `export SLURM_CONF=DIR/slurm.conf`), munged uses its own key and socket
# in DIR, and the ports are not Slurm's defaults, so a real Slurm on the machine is not disturbed.
set -euo pipefail

die() { echo "local_cluster: error: $*" >&2; exit 1; }
[[ $# -eq 2 ]] || die "usage: local_cluster.sh start|stop DIR"
cmd=$1 dir=$(realpath -m "$2")
conf=$dir/slurm.conf
node=$(hostname -s)

stop() {
  local f pid
  for f in slurmd slurmctld munged; do
    [[ -f $dir/$f.pid ]] || continue
    pid=$(cat "$dir/$f.pid")
    kill "$pid" 2>/dev/null || true
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$pid" 2>/dev/null || true
    rm -f "$dir/$f.pid"
  done
}

wait_for() {  # wait_for SECONDS WHAT COMMAND...: each try at most 5 s, all of them at most SECONDS
  local limit=$1 what=$2; shift 2
  local deadline=$((SECONDS + limit))
  while ((SECONDS < deadline)); do
    timeout 5 "$@" >/dev/null 2>&1 && return 0
    sleep 0.2
  done
  die "$what did not come up within ${limit} s (logs in $dir)"
}

start() {
  [[ $(id -u) -eq 0 ]] || die "needs root (slurmd starts the job's processes as the job's user)"
  getent hosts "$node" >/dev/null || die "this machine's name '$node' does not resolve (getent hosts): Slurm addresses nodes by name"
  local b
  for b in munged slurmctld slurmd sbatch scontrol sinfo; do
    command -v "$b" >/dev/null || die "$b not found (apt-get install slurmctld slurmd slurm-client munge)"
  done
  stop
  ((${#dir} < 80)) || die "$dir: too long a path for munged's socket (at most 108 bytes in all); use a shorter one"
  mkdir -p "$dir"/{state,spool,munge}
  chmod 700 "$dir/munge"
  [[ -f $dir/munge/munge.key ]] || { head -c 1024 /dev/urandom > "$dir/munge/munge.key"; chmod 400 "$dir/munge/munge.key"; }
  munged --force --key-file "$dir/munge/munge.key" --socket "$dir/munge/socket" \
    --pid-file "$dir/munged.pid" --log-file "$dir/munged.log" --seed-file "$dir/munge/seed"
  wait_for 10 munged test -S "$dir/munge/socket"
  # CPUs: jobs of 4 ranks must fit one node even on a 2-core machine (config_overrides lets
  # slurmd believe the configured count).
  local cpus; cpus=$(nproc); ((cpus < 8)) && cpus=8
  cat > "$conf" <<CONF
ClusterName=loom-local
SlurmctldHost=$node
SlurmUser=root
SlurmctldPort=16817
SlurmdPort=16818
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$dir/munge/socket
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmctldLogFile=$dir/slurmctld.log
SlurmdLogFile=$dir/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SwitchType=switch/none
MpiDefault=none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SlurmdParameters=config_overrides
ReturnToService=2
NodeName=$node CPUs=$cpus State=UNKNOWN
PartitionName=local Nodes=$node Default=YES MaxTime=INFINITE State=UP
CONF
  export SLURM_CONF=$conf
  timeout 20 slurmctld -f "$conf" || die "slurmctld did not start (logs in $dir)"
  wait_for 20 slurmctld scontrol ping
  timeout 20 slurmd -f "$conf" || die "slurmd did not start (logs in $dir)"
  wait_for 20 "slurmd on $node" bash -c "sinfo -h -N -o %t | grep -qE '^(idle|mix|alloc)'"
  echo "local_cluster: one-node Slurm up on $node ($cpus CPUs); export SLURM_CONF=$conf"
}

case $cmd in
  start) start ;;
  stop) stop ;;
  *) die "usage: local_cluster.sh start|stop DIR" ;;
esac
