#!/usr/bin/env bash
# The command-line walkthrough of docs/cli.md, recorded as it runs: a private 4-CPU Ray
# cluster on this machine, a job that grows to 3 replicas, a second job that takes 2 of its
# CPUs and ends, the first growing back, then ls, logs, status, an owner's guard, cp and
# stop. Prints each command and its real output. About 4 minutes.
#
#   bash examples/cli_session.sh > session.txt
#
# It starts its own cluster in a temporary directory (its own ports, never `ray stop`,
# which would stop every Ray instance on the machine) and stops it at the end.
set -u
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d /tmp/adaptdl-cli-session-XXXX)
export RAY_AUTH_MODE=disabled XDG_CACHE_HOME="$work/cache"
run() { echo "\$ $*"; eval "$@" 2>&1; }
cd "$work"
cp "$here/simulated_gpu_job.py" train.py
# Free ports for the cluster's GCS, dashboard, client server and dashboard agent.
read -r gcs dash client agent < <(python -c "
import socket; s = [socket.socket() for _ in range(4)]
[x.bind(('127.0.0.1', 0)) for x in s]; print(*[x.getsockname()[1] for x in s])")
# (--block in a process group of its own: stopping that group stops this cluster only)
setsid ray start --head --block --num-cpus 4 --port "$gcs" --dashboard-port "$dash" \
    --ray-client-server-port "$client" --dashboard-agent-listen-port "$agent" \
    --temp-dir "$work/ray" --disable-usage-stats --include-dashboard true \
    > ray-start.log 2>&1 &
cluster=$!
disown "$cluster"  # (its end at the trap is no news)
trap 'kill -TERM -- -$cluster 2>/dev/null; sleep 3; kill -KILL -- -$cluster 2>/dev/null; rm -rf "$work"' EXIT
for _ in $(seq 60); do
    kill -0 "$cluster" 2>/dev/null || { cat ray-start.log; exit 1; }
    curl -sf "http://127.0.0.1:$dash/api/version" > /dev/null && break
    sleep 1
done
export RAY_ADDRESS=http://127.0.0.1:$dash
run adaptdl-ray submit --name big --max-replicas 3 --allocation-interval 10 \
    --storage-path "$work/jobs" train.py --epochs 400
sleep 45
run adaptdl-ray ls
run adaptdl-ray submit --name hog --min-replicas 2 --max-replicas 2 --storage-path "$work/jobs" \
    train.py --epochs 40 --ms-per-sample 40
sleep 25
run adaptdl-ray ls
sleep 75
run adaptdl-ray ls
run "adaptdl-ray logs big | grep 'job big'"
run adaptdl-ray status
run "LOGNAME=ada adaptdl-ray stop big"
run adaptdl-ray cp big ./big-now
run "python -c \"from adaptdl_core.torch import model_state_dict; print(sorted(model_state_dict('big-now')))\""
run adaptdl-ray stop big
run adaptdl-ray ls --wide
