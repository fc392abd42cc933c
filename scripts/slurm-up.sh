#!/usr/bin/env bash
# Install (Debian packages) and start a single-node Slurm on this machine, for
# tests and for trying sarl's Slurm executor without a cluster.
#
#   scripts/slurm-up.sh          # idempotent: a second call finds it running
#   scripts/slurm-down.sh        # stops exactly the daemons this started
#
# What it brings up, all on localhost, all as root:
#   munged, MariaDB (private datadir), slurmdbd (accounting: submitit needs
#   sacct), slurmctld, slurmd advertising 8 CPUs and 2 fake GPUs.
# Partitions:
#   cpu     default, preemptible by requeue
#   gpu     2 fake GPU devices (character devices), preemptible by requeue
#   urgent  higher PriorityTier: its jobs preempt cpu and gpu jobs
#
# Needs root (it writes /etc/slurm and starts daemons). State, logs and PID
# files live in $SARL_SLURM_STATE (default /var/lib/sarl-slurm).
set -euo pipefail

STATE=${SARL_SLURM_STATE:-/var/lib/sarl-slurm}
CPUS=${SARL_SLURM_CPUS:-8}
MEM_MB=${SARL_SLURM_MEM_MB:-16000}
GRACE_S=${SARL_SLURM_GRACE_S:-30}
HOST=$(hostname -s)

log() { echo "slurm-up: $*" >&2; }
die() { log "error: $*"; exit 1; }

[ "$(id -u)" = 0 ] || die "must run as root (it installs packages and writes /etc/slurm)"

alive() { # alive PIDFILE NAME -> 0 when the PID in it is a live process named NAME
  # The name matters: PID files outlive a reboot, and a PID recorded before it
  # may now belong to anything (a stale slurmd.pid once kept slurmd from starting).
  local pid
  [ -s "$1" ] || return 1
  pid=$(cat "$1")
  kill -0 "$pid" 2>/dev/null && [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = "$2" ]
}

if alive "$STATE/pids/slurmctld.pid" slurmctld && alive "$STATE/pids/slurmd.pid" slurmd \
   && alive "$STATE/pids/slurmdbd.pid" slurmdbd && sinfo -h >/dev/null 2>&1; then
  log "already running (state in $STATE)"
  exit 0
fi

need=()
for b in slurmctld slurmd sbatch slurmdbd munged mariadbd; do
  command -v "$b" >/dev/null 2>&1 || need+=("$b")
done
if [ ${#need[@]} -gt 0 ]; then
  log "installing Debian packages (missing: ${need[*]})"
  export DEBIAN_FRONTEND=noninteractive
  apt-get -o DPkg::Lock::Timeout=600 update -qq
  apt-get -o DPkg::Lock::Timeout=600 install -y -qq slurmctld slurmd slurm-client slurmdbd munge mariadb-server >/dev/null
fi

mkdir -p "$STATE"/{pids,log,ctld,d,mysql-run,gpu}
chmod 755 "$STATE"

# --- fake GPU devices: gres needs character devices, a plain file is refused
for i in 0 1; do
  [ -c "$STATE/gpu/nvidia$i" ] || mknod "$STATE/gpu/nvidia$i" c 1 3
done

# --- munge
if ! alive "$STATE/pids/munged.pid" munged; then
  mkdir -p /run/munge /var/log/munge /var/lib/munge
  chown munge:munge /run/munge /var/log/munge /var/lib/munge
  [ -s /etc/munge/munge.key ] || { dd if=/dev/urandom bs=1 count=1024 of=/etc/munge/munge.key 2>/dev/null; }
  chown munge:munge /etc/munge/munge.key && chmod 400 /etc/munge/munge.key
  rm -f /run/munge/munged.pid
  runuser -u munge -- /usr/sbin/munged --pid-file=/run/munge/munged.pid
  for _ in $(seq 50); do [ -s /run/munge/munged.pid ] && break; sleep 0.1; done
  cp /run/munge/munged.pid "$STATE/pids/munged.pid"
fi

# --- MariaDB in a private datadir
if ! alive "$STATE/mysql-run/mariadb.pid" mariadbd; then
  if [ ! -d "$STATE/mysql/mysql" ]; then
    mariadb-install-db --user=mysql --datadir="$STATE/mysql" --auth-root-authentication-method=socket >/dev/null
  fi
  chown -R mysql:mysql "$STATE/mysql" "$STATE/mysql-run"
  mariadbd --user=mysql --datadir="$STATE/mysql" --socket="$STATE/mysql-run/mysqld.sock" \
    --pid-file="$STATE/mysql-run/mariadb.pid" --bind-address=127.0.0.1 --port=3306 \
    --skip-name-resolve --innodb-buffer-pool-size=64M >"$STATE/log/mariadb.log" 2>&1 &
  for _ in $(seq 100); do
    mariadb --socket="$STATE/mysql-run/mysqld.sock" -e 'select 1' >/dev/null 2>&1 && break; sleep 0.2
  done
  mariadb --socket="$STATE/mysql-run/mysqld.sock" -e 'select 1' >/dev/null 2>&1 || die "MariaDB did not start: $STATE/log/mariadb.log"
fi
mariadb --socket="$STATE/mysql-run/mysqld.sock" <<'SQL'
CREATE DATABASE IF NOT EXISTS slurm_acct_db;
CREATE USER IF NOT EXISTS 'slurm'@'127.0.0.1' IDENTIFIED BY 'sarl-local';
CREATE USER IF NOT EXISTS 'slurm'@'localhost' IDENTIFIED BY 'sarl-local';
GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1';
GRANT ALL ON slurm_acct_db.* TO 'slurm'@'localhost';
SQL

# --- configuration
mkdir -p /etc/slurm
cat >/etc/slurm/slurm.conf <<EOF
# Written by sarl scripts/slurm-up.sh: a single-node test cluster.
ClusterName=sarl
SlurmctldHost=$HOST(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=cred_expire=10
StateSaveLocation=$STATE/ctld
SlurmdSpoolDir=$STATE/d
SlurmctldPidFile=$STATE/pids/slurmctld.pid
SlurmdPidFile=$STATE/pids/slurmd.pid
SlurmctldLogFile=$STATE/log/slurmctld.log
SlurmdLogFile=$STATE/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU_Memory
DefMemPerCPU=256
GresTypes=gpu
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=127.0.0.1
AccountingStorageTRES=gres/gpu
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
SchedulerParameters=bf_interval=2,sched_interval=2
SchedulerType=sched/backfill
SlurmdParameters=config_overrides
SlurmctldParameters=preempt_send_user_signal
JobRequeue=1
PreemptType=preempt/partition_prio
PreemptMode=REQUEUE
KillWait=5
MinJobAge=600
MaxArraySize=100001
MaxJobCount=200000
ReturnToService=2
NodeName=$HOST NodeAddr=127.0.0.1 CPUs=$CPUS RealMemory=$MEM_MB Gres=gpu:2 State=UNKNOWN
PartitionName=cpu Nodes=$HOST Default=YES MaxTime=INFINITE State=UP PriorityTier=1 PreemptMode=REQUEUE GraceTime=$GRACE_S
PartitionName=gpu Nodes=$HOST MaxTime=INFINITE State=UP PriorityTier=1 PreemptMode=REQUEUE GraceTime=$GRACE_S
PartitionName=urgent Nodes=$HOST MaxTime=INFINITE State=UP PriorityTier=10 PreemptMode=OFF
EOF
cat >/etc/slurm/gres.conf <<EOF
NodeName=$HOST Name=gpu File=$STATE/gpu/nvidia[0-1]
EOF
cat >/etc/slurm/slurmdbd.conf <<EOF
AuthType=auth/munge
DbdHost=localhost
DbdAddr=127.0.0.1
SlurmUser=root
PidFile=$STATE/pids/slurmdbd.pid
LogFile=$STATE/log/slurmdbd.log
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort=3306
StorageUser=slurm
StoragePass=sarl-local
StorageLoc=slurm_acct_db
EOF
chmod 600 /etc/slurm/slurmdbd.conf

# --- daemons
if ! alive "$STATE/pids/slurmdbd.pid" slurmdbd; then
  rm -f "$STATE/pids/slurmdbd.pid"
  slurmdbd
  for _ in $(seq 100); do sacctmgr -n list cluster >/dev/null 2>&1 && break; sleep 0.2; done
  sacctmgr -n list cluster >/dev/null 2>&1 || die "slurmdbd did not answer: $STATE/log/slurmdbd.log"
fi
sacctmgr -n list cluster format=cluster | grep -qw sarl || sacctmgr -i add cluster sarl >/dev/null
if ! alive "$STATE/pids/slurmctld.pid" slurmctld; then rm -f "$STATE/pids/slurmctld.pid"; slurmctld; fi
# slurmd registers once when it starts: start it when the controller answers.
for _ in $(seq 100); do scontrol ping 2>/dev/null | grep -q UP && break; sleep 0.2; done
if ! alive "$STATE/pids/slurmd.pid" slurmd; then rm -f "$STATE/pids/slurmd.pid"; slurmd; fi

for _ in $(seq 150); do
  st=$(sinfo -h -n "$HOST" -o %t 2>/dev/null | head -1 || true)
  case "$st" in idle*|mix*|alloc*) break ;; esac
  sleep 0.2
done
st=$(sinfo -h -n "$HOST" -o %t 2>/dev/null | head -1 || true)
case "$st" in
  idle*|mix*|alloc*) ;;
  *) scontrol update nodename="$HOST" state=resume >/dev/null 2>&1 || true; sleep 1
     st=$(sinfo -h -n "$HOST" -o %t 2>/dev/null | head -1 || true)
     case "$st" in idle*|mix*|alloc*) ;; *)
       for f in slurmd slurmctld; do log "last lines of $STATE/log/$f.log:"; tail -n 15 "$STATE/log/$f.log" >&2 || true; done
       die "node $HOST is '$st': see $STATE/log/slurmd.log and slurmctld.log" ;; esac ;;
esac
log "up: partitions $(sinfo -h -o %P | tr '\n' ' ')(state in $STATE)"
