#!/usr/bin/env bash
# A single-node Slurm for the tests (issue 41): munged, slurmctld -D and slurmd -D as root in the
# background, a slurm.conf generated in folder $2 (the node sized from nproc and free), nothing
# written outside it. No accounting storage: sacct has no records there, so the driver reads
# `scontrol show job` (MinJobAge keeps finished jobs an hour); jobcomp/filetxt logs every job.
#   slurm_node.sh start DIR   prints "SLURM_CONF=DIR/slurm.conf" once the node is idle; exit 77
#                             (with the reason on stderr) where Slurm cannot run here
#   slurm_node.sh stop DIR    ends the three daemons it started (by their pid files)
set -u
cmd=${1:?start|stop}
T=${2:?folder}
skip() { echo "slurm_node: $*" >&2; exit 77; }
if [ "$cmd" = stop ]; then
  for p in slurmd slurmctld munged; do
    [ -f "$T/$p.pid" ] && kill "$(cat "$T/$p.pid")" 2>/dev/null
  done
  exit 0
fi
[ "$(id -u)" -eq 0 ] || skip "needs root (slurmd runs jobs as their user)"
for b in munged slurmctld slurmd sbatch squeue scontrol; do
  command -v "$b" >/dev/null 2>&1 || skip "$b is not installed (scripts/install-deps.sh: slurm-wlm munge)"
done
mkdir -p "$T/state" "$T/spool" "$T/munge"
chmod 700 "$T/munge"
key=/etc/munge/munge.key
if [ ! -r "$key" ]; then
  key=$T/munge/munge.key
  dd if=/dev/urandom of="$key" bs=1024 count=1 2>/dev/null
  chmod 400 "$key"
fi
munged --force --socket="$T/munge/munge.sock" --key-file="$key" --pid-file="$T/munged.pid" \
  --log-file="$T/munge/munged.log" --seed-file="$T/munge/seed" || skip "munged did not start"
cpus=$(nproc)
mem=$(free -m | awk '/^Mem:/ {print int($2 * 0.8)}')
port=$((20000 + RANDOM % 20000))
cat >"$T/slurm.conf" <<CONF
ClusterName=lockstep
SlurmctldHost=localhost
SlurmUser=root
SlurmdUser=root
SlurmctldPort=$port
SlurmdPort=$((port + 1))
AuthType=auth/munge
AuthInfo=socket=$T/munge/munge.sock
CredType=cred/munge
StateSaveLocation=$T/state
SlurmdSpoolDir=$T/spool
SlurmctldPidFile=$T/slurmctld.pid
SlurmdPidFile=$T/slurmd.pid
SlurmctldLogFile=$T/slurmctld.log
SlurmdLogFile=$T/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
ReturnToService=2
SchedulerType=sched/builtin
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/filetxt
JobCompLoc=$T/jobcomp.log
MinJobAge=3600
KillWait=2
InactiveLimit=0
NodeName=lockstep0 NodeHostname=localhost NodeAddr=127.0.0.1 CPUs=$cpus RealMemory=$mem State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4
CONF
export SLURM_CONF=$T/slurm.conf
(slurmctld -D -i -f "$T/slurm.conf" >"$T/slurmctld.out" 2>&1 &)
(slurmd -D -N lockstep0 -f "$T/slurm.conf" >"$T/slurmd.out" 2>&1 &)
for _ in $(seq 1 100); do
  state=$(scontrol show node lockstep0 2>/dev/null | awk -F'State=' '/State=/ {split($2, a, " "); print a[1]; exit}')
  case "$state" in
    IDLE*) echo "SLURM_CONF=$T/slurm.conf"; exit 0 ;;
  esac
  sleep 0.2
done
tail -5 "$T/slurmctld.log" "$T/slurmd.log" >&2 2>/dev/null
"$0" stop "$T"
skip "the node did not become idle in 20 s"
