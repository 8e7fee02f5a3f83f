"""What the first training step at a new batch size costs, over the next steps at it.

Why it matters: the autoscaler changes the input shape whenever it changes the batch
size, and frameworks set things up per shape (oneDNN primitives on CPU, cuDNN autotuning
with ``cudnn.benchmark``, a recompile under ``torch.compile``). The loader therefore
chooses among few sizes (``adaptdl_core.torch.data.preferred_local_sizes``).

Method: the digits CNN of ``examples/digits_data.py`` (plain torch, one thread, SGD with
momentum) steps at a sequence of batch sizes, each new size ``repeats`` times in a row;
per size, the first step's time minus the median of the following ones is the set-up
cost. Sizes are visited in a shuffled order, and the whole sequence is run in several
fresh processes (a shape seen once stays set up for the life of a process). Times are
process CPU time (one thread: the wall time of the work, not of the neighbours).

Usage: ``python benchmarks/new_shape_cost.py [--runs N]`` (about 20 s for 3 runs).
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common  # noqa: E402

SIZES = (16, 24, 29, 32, 48, 53, 64, 80, 96, 128)
REPEATS = 6


def worker(seed: int) -> None:
    """One fresh process: step through ``SIZES`` (shuffled by ``seed``), ``REPEATS`` steps
    each, and emit per size (first step's, median later step's) CPU seconds."""
    import torch
    import torch.nn.functional as F

    sys.path.insert(0, str(_common.ROOT / "examples"))
    from digits_data import DigitsCNN, load_digits_datasets

    torch.set_num_threads(1)
    torch.manual_seed(seed)
    train, _ = load_digits_datasets()
    x, y = train.tensors
    model = DigitsCNN()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)

    def step(b: int) -> float:
        t0 = time.process_time()
        optimizer.zero_grad()
        F.cross_entropy(model(x[:b]), y[:b]).backward()
        optimizer.step()
        return time.process_time() - t0

    step(8)  # the process's own first-call costs, not any shape's
    step(8)
    sizes = list(SIZES)
    random.Random(seed).shuffle(sizes)
    out = {}
    for b in sizes:
        times = [step(b) for _ in range(REPEATS)]
        out[b] = (times[0], _common.median(times[1:]))
    _common.emit_result({str(b): v for b, v in out.items()})


def main() -> None:
    """Run the workers and print the table (see the module docstring)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--runs", type=int, default=3, help="fresh processes (default 3)")
    p.add_argument("--worker", type=int, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker is not None:
        worker(args.worker)
        return
    runs = []
    for seed in range(args.runs):
        (status, text), = _common.launch_job(Path(__file__).resolve(),
                                             ["--worker", str(seed)], timeout=300)
        if status != 0:
            raise RuntimeError(f"worker {seed} exited {status}:\n{text[-3000:]}")
        runs.append({int(b): v for b, v in _common.parse_result(text).items()})
    rows = []
    for b in SIZES:
        first = [r[b][0] * 1e3 for r in runs]
        later = [r[b][1] * 1e3 for r in runs]
        extra = [f - t for f, t in zip(first, later)]
        rows.append([str(b), f"{_common.median(later):.2f}", f"{_common.median(first):.2f}",
                     f"{_common.median(extra):.2f} [{min(extra):.2f}, {max(extra):.2f}]"])
    print(f"Machine: {_common.machine_description()}\n")
    print(f"Command: python benchmarks/new_shape_cost.py --runs {args.runs}\n")
    print(_common.markdown_table(
        ["batch", "later steps (ms, median)", "first step (ms, median)",
         "first minus later (ms): median [min, max] over runs"], rows))


if __name__ == "__main__":
    main()
