#!/usr/bin/env bash
# Stop exactly the daemons that scripts/slurm-up.sh started, by the PIDs it
# recorded; nothing else on the machine is touched. Idempotent.
set -uo pipefail
STATE=${SARL_SLURM_STATE:-/var/lib/sarl-slurm}

stop() { # stop NAME PIDFILE
  local pid
  [ -s "$2" ] || return 0
  pid=$(cat "$2")
  # Only the daemon itself: a PID file that outlived a reboot may name anything.
  if kill -0 "$pid" 2>/dev/null && [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = "$1" ]; then
    kill "$pid"
    for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -0 "$pid" 2>/dev/null && kill -9 "$pid"
    echo "slurm-down: stopped $1 ($pid)" >&2
  fi
  rm -f "$2"
}

stop slurmd "$STATE/pids/slurmd.pid"
stop slurmctld "$STATE/pids/slurmctld.pid"
stop slurmdbd "$STATE/pids/slurmdbd.pid"
stop mariadbd "$STATE/mysql-run/mariadb.pid"
stop munged "$STATE/pids/munged.pid"
