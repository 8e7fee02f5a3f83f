"""Helpers shared by the training benchmarks (step_overhead.py, autobsz.py).

Nothing here imports torch, so the parent (orchestrating) processes stay light; the
measurements themselves run in child processes started with :func:`launch`.
"""

from __future__ import annotations

import json
import math
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Iterable, Sequence

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from adaptdl_core import launch  # noqa: E402  (light: no torch import)


def child_variables(extra: dict | None = None) -> dict:
    """The variables of a replica besides the job's ``ADAPTDL_*`` ones: a long timeout,
    one intra-op thread, the repository on PYTHONPATH, then ``extra``."""
    return {
        "ADAPTDL_TIMEOUT": "120",
        "OMP_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
        "PYTHONUNBUFFERED": "1",
        "PYTHONPATH": os.pathsep.join([str(ROOT)] + ([os.environ["PYTHONPATH"]]
                                                     if os.environ.get("PYTHONPATH") else [])),
        **(extra or {})}


def child_env(extra: dict | None = None) -> dict:
    """Environment of a one-replica job: its ADAPTDL_* variables (no checkpoint path; port
    0: its store picks a free port itself) and :func:`child_variables`."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("ADAPTDL_")}
    return launch.replica_env(0, 1, 0, base_env=base, extra_env=child_variables(extra))


def launch_job(script: str | Path, args: Sequence[str], replicas: int = 1,
               timeout: float = 600) -> list[tuple[int, str]]:
    """Run ``replicas`` processes of ``script args`` as one job (on a port held for its
    store until replica 0 listens: :func:`adaptdl_core.launch.start_replicas`); returns
    (status, output) per rank. Processes still running at ``timeout`` are killed."""
    procs = launch.start_replicas([sys.executable, str(script), *args], replicas,
                                  extra_env=child_variables(), capture_output=True,
                                  cwd=str(ROOT))
    return launch.wait_replicas(procs, timeout)


RESULT_MARK = "@@RESULT@@ "


def emit_result(obj) -> None:
    """Print a JSON result line that :func:`parse_result` finds in a child's output."""
    print(RESULT_MARK + json.dumps(obj), flush=True)


def parse_result(output: str):
    """The last JSON result line (see :func:`emit_result`) of a child's output.

    Raises:
        RuntimeError: if there is none (with the output's end, to see why).
    """
    for line in reversed(output.splitlines()):
        if line.startswith(RESULT_MARK):
            return json.loads(line[len(RESULT_MARK):])
    raise RuntimeError("child printed no result; its output ends with:\n" + output[-3000:])


def quantile(values: Sequence[float], q: float) -> float:
    """Linear-interpolated quantile (q in [0, 1]) of a non-empty sequence."""
    xs = sorted(values)
    pos = q * (len(xs) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    if pos == lo or xs[hi] == xs[lo]:
        return xs[lo]
    if math.isinf(xs[hi]):  # e.g. "never reached": avoid inf - inf
        return xs[hi]
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def median(values: Iterable[float]) -> float:
    """The median of a non-empty iterable."""
    return statistics.median(list(values))


def median_ci(values: Sequence[float], confidence: float = 0.95) -> tuple[float, float]:
    """Distribution-free confidence interval of the median: the order statistics
    ``x[j]``, ``x[n-1-j]`` (0-based) with the largest ``j`` such that at most ``j`` of
    ``n`` values fall below the median with probability <= ``(1 - confidence) / 2``
    (a Binomial(n, 1/2) tail). Below 6 values at 95% this is the full range, with less
    confidence than asked."""
    xs = sorted(values)
    n = len(xs)
    tail = (1.0 - confidence) / 2.0
    j, cumulative = 0, 0.0
    for k in range(n // 2):
        cumulative += math.comb(n, k) / 2.0 ** n  # P(at most k values below the median)
        if cumulative > tail:
            break
        j = k
    return xs[j], xs[n - 1 - j]


def iqr_text(values: Sequence[float], fmt: str = "{:.3f}") -> str:
    """'median [p25, p75]'."""
    return (fmt.format(median(values)) + " [" + fmt.format(quantile(values, 0.25)) + ", "
            + fmt.format(quantile(values, 0.75)) + "]")


class ArmClock:
    """A stand-in for the ``time`` module whose ``monotonic()`` leaves out the seconds
    added to ``excluded``: given to the library (``_metrics.time = ArmClock()``) when one
    arm is interleaved with others, so that its wall-clock schedules (throughput refits)
    run as if that arm trained alone. Everything else is ``time``'s."""

    excluded = 0.0

    def monotonic(self) -> float:
        """``time.monotonic()`` minus the excluded seconds."""
        return time.monotonic() - self.excluded

    def __getattr__(self, name: str):
        return getattr(time, name)


def isolate_library_clock(metrics_module) -> tuple[ArmClock, list[float]]:
    """Give the library's step-metrics module (``adaptdl_core.torch._metrics``) an
    :class:`ArmClock` and count its throughput-model fits.

    Returns:
        ``(clock, fits)``: add the seconds other arms run to ``clock.excluded``; ``fits``
        collects the seconds each fit took.
    """
    clock = ArmClock()
    metrics_module.time = clock
    fits: list[float] = []
    real_fit = metrics_module.fit_perf_params

    def counted_fit(*args, **kwargs):
        start = time.perf_counter()
        try:
            return real_fit(*args, **kwargs)
        finally:
            fits.append(time.perf_counter() - start)

    metrics_module.fit_perf_params = counted_fit
    return clock, fits


def markdown_table(header: Sequence[str], rows: Iterable[Sequence]) -> str:
    """A GitHub markdown table of ``header`` and ``rows`` (cells formatted with str)."""
    lines = ["| " + " | ".join(header) + " |",
             "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def machine_description() -> str:
    """CPU model, core count, load average, Python and torch versions (torch read from
    its metadata, without importing it)."""
    cpu = platform.processor() or "unknown CPU"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    try:
        from importlib.metadata import version
        torch_version = version("torch")
    except Exception:  # pragma: no cover
        torch_version = "?"
    try:
        load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:  # pragma: no cover
        load = "?"
    return (f"{cpu}, {os.cpu_count()} cores, load average {load} at start; "
            f"Python {platform.python_version()}, torch {torch_version}, {platform.system()}")
