"""Where one training step's time goes: one arm of ``step_overhead.py``, profiled.

Runs ``--replicas`` processes (gloo on CPU, one torch thread each) that train the digits
CNN (or the MLP) of ``step_overhead.py`` on the same tiled digits data with one arm's
wrapper and loader, for ``--steps`` optimizer steps after 20 warm-up steps, and prints
rank 0's mean wall and CPU milliseconds per step. With ``--profile`` rank 0 also runs
under cProfile and prints the functions with the most own time (``--filter`` restricts
the list to file names matching a regular expression).

    python benchmarks/profile_step.py adp+adl --replicas 2 --steps 300
    python benchmarks/profile_step.py adp+adl --replicas 2 --profile --filter "adaptdl_core|c10d"

Arms as in ``step_overhead.py``: ``ddp+dl``, ``ddp+adl``, ``adp+dl``, ``adp+adl``. One
run is one measurement on a shared machine: compare arms with ``step_overhead.py`` (paired
rounds); use this script to see *where* an arm spends its time.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common  # noqa: E402
from step_overhead import ARMS, BATCH, TILE, _make_model  # noqa: E402

WARMUP_STEPS = 20


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line options (exits with a usage message on bad values)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("arm", choices=ARMS)
    p.add_argument("--model", choices=("cnn", "mlp"), default="cnn")
    p.add_argument("--replicas", type=int, default=2)
    p.add_argument("--steps", type=int, default=300, help="timed steps (default 300)")
    p.add_argument("--profile", action="store_true", help="cProfile rank 0")
    p.add_argument("--filter", default=None, help="regex on file names of listed functions")
    p.add_argument("--top", type=int, default=30, help="functions listed (default 30)")
    p.add_argument("--sort", default="tottime", choices=("tottime", "cumtime", "ncalls"),
                   help="order of the listed functions (default tottime: own time)")
    p.add_argument("--callers", default=None,
                   help="regex: also list who called the matching functions")
    p.add_argument("--dump", default=None, help="also save rank 0's raw profile here")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.replicas < 1 or args.steps < 2:
        p.error("--replicas must be >= 1 and --steps >= 2")
    return args


def worker(args: argparse.Namespace) -> None:
    """One replica: train ``args.arm`` for the warm-up and timed steps; rank 0 prints."""
    import torch
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel
    from torch.utils.data import DataLoader, TensorDataset
    from torch.utils.data.distributed import DistributedSampler

    sys.path.insert(0, str(_common.ROOT / "examples"))
    from digits_data import load_digits_datasets

    import adaptdl_core.torch as adl
    from adaptdl_core import env

    torch.set_num_threads(1)
    adl.init_process_group("gloo")
    rank, replicas = env.replica_rank(), env.num_replicas()
    x, y = load_digits_datasets()[0].tensors
    dataset = TensorDataset(x.repeat(TILE, 1, 1, 1), y.repeat(TILE))
    torch.manual_seed(0)
    model = _make_model(args.model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    wrapped = (DistributedDataParallel(model) if args.arm.startswith("ddp")
               else adl.AdaptiveDataParallel(model, optimizer))
    if args.arm.endswith("+dl"):
        sampler = DistributedSampler(dataset, replicas, rank, seed=0) if replicas > 1 else None
        loader = DataLoader(dataset, batch_size=BATCH // replicas, drop_last=True,
                            shuffle=sampler is None, sampler=sampler)
    else:
        loader = adl.AdaptiveDataLoader(dataset, batch_size=BATCH, shuffle=True,
                                        drop_last=True)
        if args.arm == "adp+adl":
            loader.autoscale_batch_size(BATCH)

    def run(steps: int) -> int:
        done = 0
        while done < steps:  # an autoscaled epoch may end early: start another
            for inputs, labels in loader:
                optimizer.zero_grad()
                F.cross_entropy(wrapped(inputs), labels).backward()
                optimizer.step()
                done += 1
                if done >= steps:
                    break
        return done

    run(WARMUP_STEPS)
    profiler = cProfile.Profile() if args.profile and rank == 0 else None
    wall, cpu = time.perf_counter(), time.process_time()
    if profiler is not None:
        profiler.enable()
    steps = run(args.steps)
    if profiler is not None:
        profiler.disable()
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    if rank == 0:
        print(f"{args.arm} {args.model} x{replicas}: {1e3 * wall / steps:.2f} ms/step wall, "
              f"{1e3 * cpu / steps:.2f} ms/step CPU ({steps} steps"
              f"{', under cProfile' if profiler else ''})")
        if profiler is not None:
            out = io.StringIO()
            stats = pstats.Stats(profiler, stream=out).sort_stats(args.sort)
            stats.print_stats(*([args.filter] if args.filter else []), args.top)
            if args.callers:
                stats.print_callers(args.callers)
            if args.dump:
                stats.dump_stats(args.dump)
            print(out.getvalue())


def main(argv: list[str] | None = None) -> int:
    """Launch the replicas, print rank 0's output (and any failed rank's); exit status."""
    args = parse_args(argv)
    if args.worker:
        worker(args)
        return 0
    forwarded = list(argv if argv is not None else sys.argv[1:])
    results = _common.launch_job(Path(__file__), forwarded + ["--worker"],
                                 replicas=args.replicas)
    for rank, (status, output) in enumerate(results):
        if rank == 0 or status != 0:
            print(output if status == 0 else f"rank {rank} failed ({status}):\n{output}")
    return max(status for status, _ in results)


if __name__ == "__main__":
    sys.exit(main())
