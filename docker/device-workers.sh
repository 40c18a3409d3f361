#!/bin/sh
# One `tunefleet worker` per OpenCL device of a type, in one container (the compose `gpu`
# profile: a container that reserves all GPUs of the host runs one worker per GPU).
#
#   TUNEFLEET_DEVICE_TYPE  gpu (default), cpu or accelerator: which devices get a worker
#   TUNEFLEET_DEVICES      explicit device indices ("0 1 2"), instead of discovering them
#   extra arguments        passed to every worker (e.g. --lease 60)
#
# SIGTERM/SIGINT is passed on once to every worker (each finishes or releases what it holds);
# the script exits when all workers have, with the first non-zero status among them.
set -u

device_type="${TUNEFLEET_DEVICE_TYPE:-gpu}"
devices="${TUNEFLEET_DEVICES:-}"
if [ -z "$devices" ]; then
    devices="$(python3 - "$device_type" <<'PY'
import sys
from tunefleet.worker.device import list_devices

kind = sys.argv[1]
print(" ".join(str(d.index) for d in list_devices() if kind in d.extra.get("type", "")))
PY
)" || exit 1
fi
if [ -z "$devices" ]; then
    echo "tunefleet-device-workers: no OpenCL device of type '$device_type' is visible" \
         "(gpu profile: is the NVIDIA container toolkit installed?)" >&2
    exit 1
fi

pids=""
# shellcheck disable=SC2317  # invoked by the trap
forward() {
    trap '' TERM INT
    # (a name of its own: sh has no local variables, the wait loop below uses $pid)
    for child in $pids; do kill -TERM "$child" 2>/dev/null; done
}
trap forward TERM INT

for index in $devices; do
    tunefleet worker --device "$index" "$@" &
    pids="$pids $!"
    echo "tunefleet-device-workers: worker on device $index (pid $!)"
done

status=0
for pid in $pids; do
    # A trapped signal ends wait early with 128+signal, which is not the worker's status: wait
    # again while the worker runs. The shell may reap it during the trap (kill -0 then fails);
    # it remembers the status, so one more wait returns it (127 only if already returned).
    while :; do
        wait "$pid"
        code=$?
        [ "$code" -le 128 ] && break
        if ! kill -0 "$pid" 2>/dev/null; then
            wait "$pid"
            again=$?
            [ "$again" -eq 127 ] || code=$again
            break
        fi
    done
    if [ "$code" -ne 0 ] && [ "$status" -eq 0 ]; then status=$code; fi
done
exit "$status"
