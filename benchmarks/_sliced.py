"""Run single-process benchmark arms side by side, in round-robin time slices.

Why: on the shared machines these benchmarks run on, the speed of the same code drifts
by up to 2x over seconds (other tenants of the host; the guest cannot see it: a
process's CPU time grows as fast as its wall time during a slow phase). Arms run one
after another meet different phases, and a short race (the digits arms reach their
targets in tenths of a second) is decided by which arm met a slow phase.

How: every arm is started as its own process. When its set-up is done and its training
clock is about to start, the arm stops itself (:func:`wait_for_turn`, a ``SIGSTOP`` to
its own process). Once every arm has stopped, :func:`run_sliced` resumes one arm at a
time for ``slice_s`` seconds of wall time, round-robin, until all have exited. Each arm
measures its training time as its own CPU time (:func:`clock`), which advances only
while it runs; with one compute thread and nothing else on its core, CPU time equals
wall time (checked on the digits CNN: within 0.5%). All arms thus sample the same
drifts of the machine, at ``slice_s`` granularity.

POSIX only (signals; the ``/proc`` state check needs Linux).
"""

from __future__ import annotations

import os
import signal
import subprocess
import tempfile
import time
from typing import Mapping, Sequence

# Turns of 10 ms: with 8 arms of the digits CNN, each arm's time to the first 1000
# samples varied by +-2% between identical arms at 10 ms, +-10% at 50 ms (the machine's
# phases are shorter than a round of long turns). Each resume refills the caches, which
# made every arm ~20-30% slower than alone at 10 ms: ratios, not absolute times, are
# what sliced runs measure.
SLICE_S = 0.01

clock = time.process_time
"""The arms' training clock: this process's CPU time in seconds (all threads)."""


def wait_for_turn() -> None:
    """Called by an arm when its set-up is done: stop until the runner resumes it."""
    os.kill(os.getpid(), signal.SIGSTOP)


def _stopped(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            # "pid (comm) state ...": the state follows the last ')'.
            return f.read().rsplit(")", 1)[1].split()[0] == "T"
    except FileNotFoundError:
        return False


def run_sliced(commands: Mapping[str, Sequence[str]], envs: Mapping[str, Mapping[str, str]],
               cwd: str, slice_s: float = SLICE_S, setup_timeout: float = 300,
               timeout: float = 1800) -> dict[str, tuple[int, str]]:
    """Run every command (each calls :func:`wait_for_turn` once) in round-robin slices.

    Arguments:
        commands: name -> argv of an arm.
        envs: name -> environment of that arm.
        cwd: working directory of all arms.
        slice_s: seconds of wall time an arm runs before the next one's turn.
        setup_timeout: seconds for every arm to reach :func:`wait_for_turn` (or exit).
        timeout: seconds for all arms to finish once slicing started.

    Returns:
        name -> (exit status, output (stdout and stderr)). An arm killed at a timeout
        has a negative status and an output that says so.
    """
    procs, files = {}, {}
    try:
        for name, argv in commands.items():
            files[name] = tempfile.TemporaryFile(mode="w+")
            procs[name] = subprocess.Popen(list(argv), env=dict(envs[name]), cwd=cwd,
                                           stdout=files[name], stderr=subprocess.STDOUT,
                                           text=True)
        deadline = time.monotonic() + setup_timeout
        while not all(p.poll() is not None or _stopped(p.pid) for p in procs.values()):
            if time.monotonic() > deadline:
                raise TimeoutError(f"arms not ready after {setup_timeout:g} s: " + ", ".join(
                    n for n, p in procs.items() if p.poll() is None and not _stopped(p.pid)))
            time.sleep(0.05)
        deadline = time.monotonic() + timeout
        alive = [p for p in procs.values() if p.poll() is None]
        while alive:
            if time.monotonic() > deadline:
                raise TimeoutError(f"arms still running after {timeout:g} s")
            for proc in alive:
                proc.send_signal(signal.SIGCONT)
                time.sleep(slice_s)
                if proc.poll() is None:
                    proc.send_signal(signal.SIGSTOP)
            alive = [p for p in alive if p.poll() is None]
    finally:
        for name, proc in procs.items():
            if proc.poll() is None:
                proc.kill()
                proc.send_signal(signal.SIGCONT)  # (a stopped process dies when resumed)
                proc.wait()
                files[name].write("\n<killed by the runner>")
    results = {}
    for name, proc in procs.items():
        files[name].seek(0)
        results[name] = (proc.returncode, files[name].read())
        files[name].close()
    return results
