"""Which library files and functions one steady-state optimizer step passes through.

A newcomer reading the runtime's step has to read every function it calls; this script
counts them. Each configuration runs a small job (an MLP on random data, SGD, the loop
of ``examples``: ``zero_grad``, forward, backward, ``optimizer.step()``, the next batch)
in its own processes, as the tests' jobs do (one process; or two processes on gloo,
started with the ADAPTDL_* variables). After ``--warmup`` optimizer steps (past the
dense noise-measurement phase of several replicas, ``NOISE_DENSE_STEPS``) it traces
``--steps`` consecutive optimizer steps with :func:`sys.setprofile` (the main thread,
where the loop body, the hooks of a CPU backward pass and the loader run) and counts,
per optimizer step (from the loop body's first micro-batch to the batch after its last
one), the calls into files of the ``adaptdl_core`` package: distinct files, distinct
functions (file, first line, name) and calls (profile ``call`` events, generator
resumptions included).

Printed per configuration: the median and the largest per-step figure over the traced
steps, and the union over them (sampled steps of the noise measurement pass through
more code than plain ones). ``--list`` also prints the functions of the union.

Configurations: 1 replica with ``autoscale_batch_size`` on and off, 2 replicas on and
off.

Usage: ``python benchmarks/step_trace.py [--warmup 100] [--steps 16] [--list]``
(about half a minute on a busy 2-core machine).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common  # noqa: E402

CONFIGS = [(1, True), (1, False), (2, True), (2, False)]  # (replicas, autoscale)
BATCH = 32
MAX_BATCH = 256
SAMPLES = 200_000  # enough that no traced step reaches the end of the epoch


# ----------------------------------------------------------------------------- worker
class _StepTracer:
    """Counts the ``call`` events whose code lies under ``root`` while enabled."""

    def __init__(self, root: str):
        self.root = root
        self.calls: list[tuple[str, int, str]] = []

    def _profile(self, frame, event, arg):  # (sys.setprofile's signature)
        if event == "call":
            code = frame.f_code
            if code.co_filename.startswith(self.root):
                self.calls.append((code.co_filename, code.co_firstlineno, code.co_qualname))

    def start(self) -> None:
        """Begin counting (the previous window's calls are kept until :meth:`take`)."""
        sys.setprofile(self._profile)

    def stop(self) -> None:
        """Stop counting."""
        sys.setprofile(None)

    def take(self) -> list[tuple[str, int, str]]:
        """The calls counted since the last take."""
        calls, self.calls = self.calls, []
        return calls


def worker(args: argparse.Namespace) -> None:
    """One replica of the traced job; replica 0 prints the per-step calls as a result."""
    import torch
    import torch.nn.functional as F
    from torch.utils.data import TensorDataset

    import adaptdl_core
    import adaptdl_core.torch as adl
    from adaptdl_core import env

    torch.set_num_threads(1)
    adl.init_process_group("gloo")
    torch.manual_seed(0)
    x = torch.randn(SAMPLES, 8)
    y = (x.sum(dim=1) > 0).long()
    dataset = TensorDataset(x, y)
    model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(),
                                torch.nn.Linear(32, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    wrapped = adl.AdaptiveDataParallel(model, optimizer)
    loader = adl.AdaptiveDataLoader(dataset, batch_size=BATCH, shuffle=True)
    if args.autoscale:
        loader.autoscale_batch_size(MAX_BATCH)
    tracer = _StepTracer(str(Path(adaptdl_core.__file__).resolve().parent))
    steps: list[list[tuple[str, int, str]]] = []
    optimizer_steps = 0
    for _epoch in adl.remaining_epochs_until(1):
        batches = iter(loader)
        batch = next(batches)
        while len(steps) < args.steps:
            tracing = optimizer_steps >= args.warmup
            if tracing:
                tracer.start()
            inputs, labels = batch
            optimizer.zero_grad()
            F.cross_entropy(wrapped(inputs), labels).backward()
            optimizer.step()
            batch = next(batches)
            if tracing:
                tracer.stop()
            # (Read outside the trace: which micro-batch the body just trained on.)
            ended_step = loader.micro_index == 0
            if ended_step:
                optimizer_steps += 1
                if tracing:
                    steps.append(tracer.take())
        batches.close()  # leave the loop cleanly (no checkpoint, no further steps)
        break
    if env.replica_rank() == 0:
        root = tracer.root
        rows = [[(f[len(root) + 1:], line, name) for f, line, name in calls]
                for calls in steps]
        _common.emit_result({"steps": rows, "batch": loader.current_batch_size})


# ----------------------------------------------------------------------------- parent
def _summary(steps: list[list[list]]) -> dict:
    """Per-step distinct files, distinct functions and calls (median, max) and the
    union over the steps."""
    files = [len({c[0] for c in calls}) for calls in steps]
    funcs = [len({tuple(c) for c in calls}) for calls in steps]
    calls = [len(calls) for calls in steps]
    union = {tuple(c) for s in steps for c in s}
    return {"files": (statistics.median(files), max(files)),
            "functions": (statistics.median(funcs), max(funcs)),
            "calls": (statistics.median(calls), max(calls)),
            "union_files": len({c[0] for c in union}), "union_functions": len(union),
            "union": sorted(union)}


def run_config(replicas: int, autoscale: bool, warmup: int, steps: int) -> dict:
    """Run one traced job; returns its :func:`_summary`."""
    args = ["--worker", "--warmup", str(warmup), "--steps", str(steps)]
    if autoscale:
        args.append("--autoscale")
    outputs = _common.launch_job(Path(__file__).resolve(), args, replicas=replicas,
                                 timeout=300)
    for rank, (status, out) in enumerate(outputs):
        if status != 0:
            raise RuntimeError(f"x{replicas} autoscale={autoscale} rank {rank} exited "
                               f"{status}:\n{out[-3000:]}")
    result = _common.parse_result(outputs[0][1])
    summary = _summary(result["steps"])
    summary["batch"] = result["batch"]
    return summary


def main() -> None:
    """Parse the arguments; run the worker, or every configuration and print the table."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--autoscale", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--warmup", type=int, default=100,
                        help="optimizer steps before the trace (default 100)")
    parser.add_argument("--steps", type=int, default=16,
                        help="optimizer steps traced (default 16)")
    parser.add_argument("--list", action="store_true",
                        help="also print the functions of every configuration's union")
    args = parser.parse_args()
    if args.warmup < 0 or args.steps < 1:
        parser.error(f"--warmup {args.warmup} --steps {args.steps}: need warmup >= 0 and "
                     "steps >= 1")
    if args.worker:
        worker(args)
        return
    started = time.perf_counter()
    rows, listings = [], []
    for replicas, autoscale in CONFIGS:
        s = run_config(replicas, autoscale, args.warmup, args.steps)
        rows.append([replicas, "on" if autoscale else "off", s["batch"],
                     "%g / %d" % s["files"], "%g / %d" % s["functions"],
                     "%g / %d" % s["calls"], s["union_files"], s["union_functions"]])
        listings.append((replicas, autoscale, s["union"]))
    print(f"steady-state optimizer steps {args.warmup + 1}..{args.warmup + args.steps}; "
          "per step: median / max over the traced steps")
    print(_common.markdown_table(
        ["replicas", "autoscale", "batch", "files", "functions", "calls",
         "union files", "union functions"], rows))
    if args.list:
        for replicas, autoscale, union in listings:
            print(f"\n## {replicas} replica(s), autoscale {'on' if autoscale else 'off'}")
            for path, line, name in union:
                print(f"  {path}:{line} {name}")
    print(f"\n({time.perf_counter() - started:.0f} s)")


if __name__ == "__main__":
    main()
