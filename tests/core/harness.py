"""Start K replicas of a script as real processes with the ADAPTDL_* variables."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

JOBS = Path(__file__).parent / "jobs"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_replicas(script: str | Path, replicas: int, ckpt: Path, restart: int,
                   args: list[str] = (), extra_env: dict | None = None) -> list[subprocess.Popen]:
    """Launch ``replicas`` processes of ``script`` (restart number ``restart``)."""
    port = free_port()
    procs = []
    for rank in range(replicas):
        env = dict(os.environ)
        env.update({
            "ADAPTDL_CHECKPOINT_PATH": str(ckpt),
            "ADAPTDL_MASTER_ADDR": "127.0.0.1",
            "ADAPTDL_MASTER_PORT": str(port),
            "ADAPTDL_REPLICA_RANK": str(rank),
            "ADAPTDL_NUM_REPLICAS": str(replicas),
            "ADAPTDL_NUM_RESTARTS": str(restart),
            "OMP_NUM_THREADS": "1",
            "PYTHONUNBUFFERED": "1",
        })
        env.update(extra_env or {})
        procs.append(subprocess.Popen([sys.executable, str(script), *args], env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    return procs


def wait_all(procs: list[subprocess.Popen], timeout: float = 120) -> list[tuple[int, str]]:
    """Wait for every process; returns (exit status, output) per rank. Kills stragglers."""
    results = []
    for proc in procs:
        try:
            out, _ = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, _ = proc.communicate()
            out += "\n<killed by harness after timeout>"
        results.append((proc.returncode, out))
    return results


def run_replicas(script, replicas, ckpt, restart, args=(), extra_env=None, timeout=120):
    """Start ``replicas`` processes and wait for them; returns [(status, output)]."""
    return wait_all(start_replicas(script, replicas, ckpt, restart, list(args), extra_env), timeout)


def read_events(record_dir: Path) -> list[dict]:
    """All JSON events written by jobs into ``record_dir``, with their file's restart/rank."""
    events = []
    for path in sorted(record_dir.glob("r*-rank*.jsonl")):
        restart, rank = path.stem[1:].split("-rank")
        for line in path.read_text().splitlines():
            event = json.loads(line)
            event.update(restart=int(restart), rank=int(rank))
            events.append(event)
    return events
