"""The processes a command starts and the CPU each uses, sampled from Linux's ``/proc``.

Shared by ``process_churn.py`` (one sweep's processes) and ``suite_cpu.py`` (the test
suite's). A thread reads every process's CPU time (user + system) and command line every
``interval_s``; a process is known by its pid and start time, and its CPU is the last
reading before it exited (a process that lives less than one interval may be missed).
Processes already running when sampling starts are left out.
"""

from __future__ import annotations

import collections
import os
import threading
import time
from typing import Callable

__all__ = ["ProcessSampler", "busy_cpu_seconds", "kinds_table", "proc_stat", "ray_titles"]

_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def proc_stat(pid: int | str) -> tuple[int, str, float, float] | None:
    """``(parent pid, start time in ticks as text, own CPU seconds, CPU seconds with the
    children it waited for)`` of one process, from ``/proc/PID/stat``; ``None`` if it is
    gone (or there is no ``/proc``)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    # After the command name: state(0) ppid(1) ... utime(11) stime(12) cutime(13)
    # cstime(14) ... starttime(19)
    own = (int(fields[11]) + int(fields[12])) / _TICK
    return int(fields[1]), fields[19], own, own + (int(fields[13]) + int(fields[14])) / _TICK


class ProcessSampler:
    """Samples ``/proc`` in a thread while used as a context manager.

    :attr:`seen` maps ``(pid, start time)`` to ``[CPU seconds, [command lines seen, in
    order]]`` (a Ray worker's command line is its title, ``ray::...``, which changes as it
    takes up an actor)."""

    def __init__(self, interval_s: float = 0.1) -> None:
        self.interval_s = interval_s
        self.seen: dict[tuple[str, str], list] = {}
        self._stop = threading.Event()
        self._ignore: set[str] = set()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> "ProcessSampler":
        self._ignore = set(os.listdir("/proc"))
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.is_set():
            for pid in os.listdir("/proc"):
                if not pid.isdigit() or pid in self._ignore:
                    continue
                stat = proc_stat(pid)
                if stat is None:
                    continue  # (it exited meanwhile)
                try:
                    with open(f"/proc/{pid}/cmdline") as f:
                        cmd = f.read().replace("\0", " ").strip()[:160]
                except OSError:
                    continue
                record = self.seen.setdefault((pid, stat[1]), [0.0, []])
                record[0] = max(record[0], stat[2])
                if cmd and (not record[1] or record[1][-1] != cmd):
                    record[1].append(cmd)
            time.sleep(self.interval_s)


def ray_titles(names: list[str]) -> list[str]:
    """The distinct Ray titles (``ray::...``, first word) among a process's command lines,
    in the order they appeared."""
    return list(dict.fromkeys(n.split()[0] for n in names if n.startswith("ray::")))


def kinds_table(seen: dict, kind_of: Callable[[list[str]], str] | None = None
                ) -> list[tuple[str, int, float]]:
    """``(kind, processes, CPU seconds)`` per kind of process, most CPU first.

    Args:
        seen: :attr:`ProcessSampler.seen`.
        kind_of: a process's kind from its command lines; by default the sequence of Ray
            titles it showed (``ray::IDLE > ray::ImplicitFunc.__init__ > ...``), else the
            first word of its command line.
    """
    def default(names: list[str]) -> str:
        titles = ray_titles(names)
        return " > ".join(titles) if titles else (names[0].split()[0] if names else "?")

    kinds: dict[str, list] = collections.defaultdict(lambda: [0, 0.0])
    for cpu, names in seen.values():
        key = (kind_of or default)(names)
        kinds[key][0] += 1
        kinds[key][1] += cpu
    return sorted(((k, n, c) for k, (n, c) in kinds.items()), key=lambda r: -r[2])


def busy_cpu_seconds() -> tuple[float, float]:
    """``(busy, all)`` CPU seconds of the whole machine since boot (``/proc/stat``;
    busy is all but idle and I/O wait): a difference of two readings gives how busy the
    machine was between them."""
    with open("/proc/stat") as f:
        values = [int(v) for v in f.readline().split()[1:]]
    idle = values[3] + (values[4] if len(values) > 4 else 0)
    return (sum(values) - idle) / _TICK, sum(values) / _TICK
