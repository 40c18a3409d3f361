#!/usr/bin/env bash
# Start, inspect and stop tunefleet workers on a list of hosts over ssh, one worker per GPU.
#
#   tunefleet-fleet.sh start  HOSTFILE    start the workers (nohup, logs and pid files remote)
#   tunefleet-fleet.sh status HOSTFILE    which workers still run
#   tunefleet-fleet.sh stop   HOSTFILE    SIGTERM: each finishes or releases its trials, exits
#
# HOSTFILE has one host per line, optionally followed by its number of GPUs (default 1);
# '#' starts a comment:
#     gpu01 4
#     gpu02 4
#
# Settings (environment of this script):
#   TUNEFLEET_DATABASE_URL  (start) the database, without a password, e.g.
#                           postgresql://tunefleet_worker@head:5432/tunefleet?sslmode=verify-full&sslrootcert=/home/me/.tunefleet/ca.crt
#   TUNEFLEET_REMOTE_ENV    file sourced on each host before starting (activate the venv...);
#                           default ~/.tunefleet/env when it exists
#   TUNEFLEET_PGPASSFILE    pgpass file on the hosts (default ~/.tunefleet/workers.pgpass)
#   TUNEFLEET_LOG_DIR       log and pid directory on the hosts (default ~/.tunefleet/fleet)
#   TUNEFLEET_WORKER_ARGS   extra worker flags (default none: wait for work; "--drain" to
#                           leave when the queue is empty)
#   TUNEFLEET_WAIT_FOR_DB_S seconds each worker keeps retrying at start while the database
#                           is down or not yet migrated (default 300)
#   TUNEFLEET_SSH           the ssh command (default "ssh -o BatchMode=yes")
#   TUNEFLEET_STOP_WAIT     seconds `stop` waits for workers to exit (default 60)
#
# Device N is the N-th OpenCL device of the host (`tunefleet devices` lists them): install
# tunefleet[opencl] without the PoCL CPU platform on GPU hosts so that device N is GPU N.
set -euo pipefail

usage() {
    echo "usage: $0 start|status|stop HOSTFILE" >&2
    exit 2
}

[[ $# -eq 2 ]] || usage
action="$1"
hostfile="$2"
[[ -r "$hostfile" ]] || { echo "tunefleet-fleet: cannot read host file $hostfile" >&2; exit 2; }

read -r -a ssh_cmd <<< "${TUNEFLEET_SSH:-ssh -o BatchMode=yes}"
log_dir="${TUNEFLEET_LOG_DIR:-\$HOME/.tunefleet/fleet}"
remote_env="${TUNEFLEET_REMOTE_ENV:-\$HOME/.tunefleet/env}"
pgpass="${TUNEFLEET_PGPASSFILE:-\$HOME/.tunefleet/workers.pgpass}"
worker_args="${TUNEFLEET_WORKER_ARGS:-}"
stop_wait="${TUNEFLEET_STOP_WAIT:-60}"
wait_for_db="${TUNEFLEET_WAIT_FOR_DB_S:-300}"

# The remote script is sent on stdin: nothing secret (and no DSN) shows on a command line.
# Paths may name the remote $HOME, so they are expanded there, not here.
remote_prelude() {
    cat <<PRELUDE
set -u
log_dir="$log_dir"
mkdir -p "\$log_dir"
PRELUDE
    cat <<'PRELUDE'
# A pid file outlives its worker (a reboot, kill -9): its number may since name another
# process, which must be neither reported as a worker nor sent SIGTERM.
worker_alive() {
    case "$(ps -o args= -p "$1" 2>/dev/null)" in
        *"tunefleet worker"*) return 0 ;;
        *) return 1 ;;
    esac
}
PRELUDE
}

remote_start() {
    local gpus="$1"
    remote_prelude
    printf 'export TUNEFLEET_DATABASE_URL=%q\n' "$TUNEFLEET_DATABASE_URL"
    printf 'worker_args=%q\n' "$worker_args"
    printf 'export TUNEFLEET_WAIT_FOR_DB_S=%q\n' "$wait_for_db"
    cat <<START
export PGPASSFILE="$pgpass"
if [ -f "$remote_env" ]; then . "$remote_env"; fi
command -v tunefleet >/dev/null || { echo "\$(hostname): tunefleet not on PATH" >&2; exit 3; }
for i in \$(seq 0 \$(( $gpus - 1 ))); do
    pidfile="\$log_dir/worker-\$i.pid"
    if [ -f "\$pidfile" ] && worker_alive "\$(cat "\$pidfile")"; then
        echo "\$(hostname): worker \$i already running (pid \$(cat "\$pidfile"))"
        continue
    fi
    nohup tunefleet worker --device "\$i" \$worker_args >>"\$log_dir/worker-\$i.log" 2>&1 </dev/null &
    echo \$! > "\$pidfile"
    echo "\$(hostname): worker \$i started (pid \$!, log \$log_dir/worker-\$i.log)"
done
START
}

remote_status() {
    remote_prelude
    cat <<'STATUS'
for pidfile in "$log_dir"/worker-*.pid; do
    [ -f "$pidfile" ] || continue
    i="${pidfile##*/worker-}"; i="${i%.pid}"
    if worker_alive "$(cat "$pidfile")"; then
        echo "$(hostname): worker $i running (pid $(cat "$pidfile"))"
    else
        echo "$(hostname): worker $i stopped"
    fi
done
STATUS
}

remote_stop() {
    remote_prelude
    printf 'stop_wait=%q\n' "$stop_wait"
    cat <<'STOP'
pids=""
for pidfile in "$log_dir"/worker-*.pid; do
    [ -f "$pidfile" ] || continue
    pid="$(cat "$pidfile")"
    if worker_alive "$pid"; then
        kill -TERM "$pid" && pids="$pids $pid"
    fi
done
waited=0
for pid in $pids; do
    while worker_alive "$pid" && [ "$waited" -lt "$stop_wait" ]; do
        sleep 1; waited=$((waited + 1))
    done
    if worker_alive "$pid"; then
        echo "$(hostname): worker pid $pid still running after ${stop_wait}s (leases will expire)"
    fi
done
for pidfile in "$log_dir"/worker-*.pid; do
    [ -f "$pidfile" ] || continue
    worker_alive "$(cat "$pidfile")" || rm -f "$pidfile"
done
echo "$(hostname): stopped"
STOP
}

case "$action" in
    start)
        : "${TUNEFLEET_DATABASE_URL:?set TUNEFLEET_DATABASE_URL (no password in it)}"
        ;;
    status|stop) ;;
    *) usage ;;
esac

status=0
while read -r host gpus _; do
    [[ -z "$host" || "$host" == \#* ]] && continue
    gpus="${gpus:-1}"
    if ! [[ "$gpus" =~ ^[1-9][0-9]*$ ]]; then
        echo "tunefleet-fleet: $host: GPU count '$gpus' is not a positive number" >&2
        status=2
        continue
    fi
    case "$action" in
        start) script="$(remote_start "$gpus")" ;;
        status) script="$(remote_status)" ;;
        stop) script="$(remote_stop)" ;;
    esac
    if ! "${ssh_cmd[@]}" "$host" bash -s <<< "$script"; then
        echo "tunefleet-fleet: $host: $action failed" >&2
        status=1
    fi
done < "$hostfile"
exit "$status"
