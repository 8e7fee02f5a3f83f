"""Start K replicas of a script as real processes with the ADAPTDL_* variables."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from adaptdl_core import launch

JOBS = Path(__file__).parent / "jobs"


def start_replicas(script: str | Path, replicas: int, ckpt: Path, restart: int,
                   args: list[str] = (), extra_env: dict | None = None) -> list[subprocess.Popen]:
    """Launch ``replicas`` processes of ``script`` (restart number ``restart``), output
    captured, one intra-op thread each."""
    return launch.start_replicas(
        [sys.executable, str(script), *args], replicas, checkpoint_path=ckpt,
        num_restarts=restart, capture_output=True,
        extra_env={"OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", **(extra_env or {})})


def wait_all(procs: list[subprocess.Popen], timeout: float = 120) -> list[tuple[int, str]]:
    """Wait for every process; returns (exit status, output) per rank. Kills stragglers."""
    return launch.wait_replicas(procs, timeout)


def run_replicas(script, replicas, ckpt, restart, args=(), extra_env=None, timeout=120):
    """Start ``replicas`` processes and wait for them; returns [(status, output)]."""
    return wait_all(start_replicas(script, replicas, ckpt, restart, list(args), extra_env), timeout)


def run_json_job(script, replicas, tmp_path, *args, timeout=300) -> list[dict]:
    """Run a job (with command-line ``args``) that prints one JSON line last; assert
    every rank exited 0 and return each rank's JSON."""
    results = run_replicas(script, replicas, tmp_path / "ckpt", 0, args, timeout=timeout)
    for rank, (status, out) in enumerate(results):
        assert status == 0, f"rank {rank} exited {status}:\n{out[-3000:]}"
    return [json.loads(out.strip().splitlines()[-1]) for _, out in results]


def read_events(record_dir: Path) -> list[dict]:
    """All JSON events written by jobs into ``record_dir``, with their file's restart/rank.
    Safe to call while they run: a line still being written (no newline yet) is left out."""
    events = []
    for path in sorted(record_dir.glob("r*-rank*.jsonl")):
        restart, rank = path.stem[1:].split("-rank")
        for line in path.read_text().splitlines(keepends=True):
            if not line.endswith("\n"):
                continue
            event = json.loads(line)
            event.update(restart=int(restart), rank=int(rank))
            events.append(event)
    return events
