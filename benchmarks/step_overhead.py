"""Per-step overhead of AdaptiveDataParallel + AdaptiveDataLoader versus plain DDP.

What is compared, on the same model, data and batch size, in the *same* process(es)
(one process for 1 replica; two processes started with the ADAPTDL_* variables, gloo on
CPU, for 2 replicas; ``torch.set_num_threads(1)`` everywhere):

=============  ===================================================================
arm            what runs
=============  ===================================================================
``ddp+dl``     ``torch.nn.parallel.DistributedDataParallel`` + ``torch`` DataLoader
               (``DistributedSampler`` with 2 replicas): the baseline
``ddp+adl``    plain DDP + ``AdaptiveDataLoader`` (fixed batch): the loader's own cost
               (elastic sampler, position tracking, a stop-flag all-reduce through the
               store every 4 batches)
``adp+dl``     ``AdaptiveDataParallel`` + torch DataLoader: the wrapper outside any
               adaptive loop (DDP's all-reduce, no noise measurement, no LR rule)
``adp+adl``    ``AdaptiveDataParallel`` + ``AdaptiveDataLoader`` with
               ``autoscale_batch_size(max_batch_size=batch)``: everything on -- gradient
               noise measured on sampled steps (with 2 replicas the local norms in one
               fused call after those steps' backward pass, and a small all-reduce every
               ~0.2 s for the side values; with 1 replica sampled steps split in two half
               batches), step profiling
               and throughput refits, goodput decisions, AdaScale around
               ``optimizer.step()``. The cap
               equal to the batch keeps the batch (and so the compute) identical to the
               baseline.
=============  ===================================================================

All arms live side by side in one job (``adaptdl_core.torch.init_process_group`` gives
the process group that plain DDP uses too). Each *round* runs every arm for one trial of
``steps`` optimizer steps, in a random order (the same on every replica); the first
``skip`` steps of a trial (iterator creation) and the first ``warmup`` rounds are not
counted. A trial's value is its mean step time (wall time per step on replica 0, the
next batch's loading included); the ratio of an arm to the baseline is taken per round
(paired) and reported as median [25th, 75th percentile] over rounds.

Models: the digits CNN of ``examples/digits_data.py`` (10k parameters: fixed per-step
costs dominate) and an MLP 64-1024-1024-1024-10 (2.2M parameters: per-parameter costs
show), both on the digits training images tiled 16x (23k samples, so that no trial
crosses an epoch), global batch 64, SGD with momentum.

``--clock cpu`` measures each trial in CPU time of the process (all its threads:
gloo's, the collective thread) instead of wall time: a run on a machine shared with
other jobs then measures our work rather than the neighbours' (waiting on the other
replica is not counted, so use it next to a wall-clock run, not instead).

Usage: ``python benchmarks/step_overhead.py [--quick] [--clock wall|cpu] [--json PATH]``
(default about 3.5 minutes on a busy 2-core machine; ``--quick`` under a minute). The
target is ``adp+adl <= 1.05 x ddp+dl`` (the median ratio; the summary also gives a
distribution-free 95% confidence interval of that median, from the rounds' order
statistics).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common  # noqa: E402

ARMS = ("ddp+dl", "ddp+adl", "adp+dl", "adp+adl")
BASELINE = "ddp+dl"
FULL = "adp+adl"
TARGET = 1.05

# (model, replicas, steps per trial, rounds, warm-up rounds): default, then --quick.
CONFIGS = {
    # Two processes on two shared cores scatter the per-round ratio widely (quartiles
    # ~0.3 apart): the 2-replica configurations get more rounds for a tighter median.
    False: [("cnn", 1, 40, 28, 2), ("cnn", 2, 40, 60, 2),
            ("mlp", 1, 20, 16, 2), ("mlp", 2, 20, 36, 2)],
    True: [("cnn", 1, 30, 8, 1), ("cnn", 2, 30, 5, 1),
           ("mlp", 1, 12, 4, 1), ("mlp", 2, 12, 3, 1)],
}
SKIP = 2          # first steps of every trial not counted (iterator creation)
BATCH = 64        # global batch size
TILE = 16         # the digits training set tiled this many times


# ----------------------------------------------------------------------------- worker
def _make_model(name: str):
    import torch
    from digits_data import DigitsCNN
    if name == "cnn":
        return DigitsCNN()
    return torch.nn.Sequential(
        torch.nn.Flatten(),
        torch.nn.Linear(64, 1024), torch.nn.ReLU(),
        torch.nn.Linear(1024, 1024), torch.nn.ReLU(),
        torch.nn.Linear(1024, 1024), torch.nn.ReLU(),
        torch.nn.Linear(1024, 10))


def worker(args: argparse.Namespace) -> None:
    import torch
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel
    from torch.utils.data import DataLoader, TensorDataset
    from torch.utils.data.distributed import DistributedSampler

    sys.path.insert(0, str(_common.ROOT / "examples"))
    from digits_data import load_digits_datasets

    import adaptdl_core.torch as adl
    from adaptdl_core import env

    from adaptdl_core.torch import _metrics

    torch.set_num_threads(1)
    adl.init_process_group("gloo")

    # The library refits its throughput model at most every REFIT_MIN_INTERVAL_S of wall
    # time. Interleaved with three other arms, the full arm would see that clock run ~4x
    # faster than its own time and refit ~4x too often; give the library a clock that
    # only runs while the full arm runs, as if it trained alone. Also count the fits.
    clock, fits = _common.isolate_library_clock(_metrics)
    rank, replicas = env.replica_rank(), env.num_replicas()
    train, _ = load_digits_datasets()
    x, y = train.tensors
    dataset = TensorDataset(x.repeat(TILE, 1, 1, 1), y.repeat(TILE))

    torch.manual_seed(0)
    init = _make_model(args.model).state_dict()
    arms = {}
    for arm in ARMS:
        model = _make_model(args.model)
        model.load_state_dict(init)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        if arm.startswith("ddp"):
            wrapped = DistributedDataParallel(model)
        else:
            wrapped = adl.AdaptiveDataParallel(model, optimizer,
                                               name="bench-" + arm.replace("+", "-"))
        if arm.endswith("+dl"):
            sampler = DistributedSampler(dataset, replicas, rank, shuffle=True, seed=0) \
                if replicas > 1 else None
            loader = DataLoader(dataset, batch_size=BATCH // replicas, drop_last=True,
                                shuffle=sampler is None, sampler=sampler)
        else:
            loader = adl.AdaptiveDataLoader(dataset, batch_size=BATCH, shuffle=True,
                                            drop_last=True)
            if arm == FULL:
                loader.autoscale_batch_size(BATCH)
        arms[arm] = (wrapped, optimizer, loader)

    clock_fn = time.process_time if args.clock == "cpu" else time.perf_counter

    def trial(arm: str) -> float:
        model, optimizer, loader = arms[arm]
        stamps = [clock_fn()]
        for inputs, labels in loader:
            optimizer.zero_grad()
            F.cross_entropy(model(inputs), labels).backward()
            optimizer.step()
            stamps.append(clock_fn())
            if len(stamps) > args.steps:
                break  # leaves the adaptive loop cleanly (the generator is closed)
        assert len(stamps) == args.steps + 1, "dataset too small for a trial"
        return (stamps[-1] - stamps[SKIP]) / (args.steps - SKIP)

    results = {arm: [] for arm in ARMS}
    # Every round is an epoch: an autoscaled loader ends its epoch by statistical
    # progress (one pass over the 23k samples), which many rounds of one epoch exceed.
    rounds = args.warmup + args.rounds
    for r, _epoch in zip(range(rounds), adl.remaining_epochs_until(rounds)):
        order = list(ARMS)
        random.Random(r).shuffle(order)  # the same order on every replica
        for arm in order:
            t0 = time.monotonic()
            t = trial(arm)
            if arm != FULL:
                clock.excluded += time.monotonic() - t0
            if r >= args.warmup:
                results[arm].append(t)
    if rank == 0:
        full = arms[FULL][0]
        gns = full.gns
        _common.emit_result({
            "step_s": results, "params": sum(p.numel() for p in full.module.parameters()),
            "gns_updates": gns.num_updates if gns is not None else 0,
            "full_batch": arms[FULL][2].current_batch_size,
            "fits": len(fits), "fit_ms": 1e3 * sum(fits) / max(len(fits), 1)})


# ----------------------------------------------------------------------------- parent
def run_config(model: str, replicas: int, steps: int, rounds: int, warmup: int,
               clock: str = "wall") -> dict:
    args = ["--worker", "--model", model, "--steps", str(steps), "--rounds", str(rounds),
            "--warmup", str(warmup), "--clock", clock]
    started = time.perf_counter()
    outputs = _common.launch_job(Path(__file__).resolve(), args, replicas=replicas, timeout=600)
    for rank, (status, out) in enumerate(outputs):
        if status != 0:
            raise RuntimeError(f"{model} x{replicas} rank {rank} exited {status}:\n{out[-3000:]}")
    result = _common.parse_result(outputs[0][1])
    result.update(model=model, replicas=replicas, steps=steps, rounds=rounds,
                  wall_s=time.perf_counter() - started)
    return result


def report(results: list[dict]) -> str:
    parts = []
    summary = []
    for res in results:
        step = res["step_s"]
        base = step[BASELINE]
        title = (f"### {res['model']} ({res['params'] / 1e6:.2f}M parameters), "
                 f"{res['replicas']} replica(s), global batch {BATCH}: {res['rounds']} "
                 f"rounds x {res['steps'] - SKIP} counted steps per arm; "
                 f"`adp+adl` refitted {res['fits']} times ({res['fit_ms']:.0f} ms each)")
        rows = []
        for arm in ARMS:
            ratios = [a / b for a, b in zip(step[arm], base)]
            rows.append([f"`{arm}`", _common.iqr_text([1e3 * t for t in step[arm]], "{:.2f}"),
                         "1 (baseline)" if arm == BASELINE else _common.iqr_text(ratios),
                         "" if arm == BASELINE else f"{min(ratios):.3f} .. {max(ratios):.3f}",
                         "" if arm == BASELINE else f"{sum(step[arm]) / sum(base):.3f}"])
        parts.append(title + "\n\n" + _common.markdown_table(
            ["arm", "ms / step: median [p25, p75]", "ratio to `ddp+dl`: median [p25, p75]",
             "ratio min .. max", "ratio of sums"], rows))
        full = [a / b for a, b in zip(step[FULL], base)]
        loader = [a / b for a, b in zip(step["ddp+adl"], base)]
        hook = [a / b for a, b in zip(step["adp+dl"], base)]
        med = _common.median(full)
        ci_lo, ci_hi = _common.median_ci(full)
        summary.append([res["model"], res["replicas"],
                        f"{1e3 * _common.median(base):.2f}",
                        f"{1e3 * _common.median(step[FULL]):.2f}",
                        _common.iqr_text(full), f"[{ci_lo:.3f}, {ci_hi:.3f}]",
                        f"{sum(step[FULL]) / sum(base):.3f}",
                        _common.iqr_text(loader), _common.iqr_text(hook),
                        "yes" if med <= TARGET else f"no (+{100 * (med - TARGET):.1f} pts)"])
    head = ("### Summary: full library (`adp+adl`) vs plain DDP (`ddp+dl`), "
            f"target <= {TARGET}x\n\n" + _common.markdown_table(
                ["model", "replicas", "DDP ms/step", "ADP+ADL ms/step",
                 "ADP+ADL / DDP: median [p25, p75]", "95% CI of the median",
                 "ratio of sums",
                 "loader only (`ddp+adl`)", "hook only (`adp+dl`)",
                 f"median <= {TARGET}x?"], summary))
    return head + "\n\n" + "\n\n".join(parts)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="fewer rounds (under a minute)")
    p.add_argument("--json", help="also write the raw per-trial step times here")
    p.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                   help="time trials by wall clock (default) or by the process's CPU time")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--model", choices=("cnn", "mlp"), help=argparse.SUPPRESS)
    p.add_argument("--steps", type=int, help=argparse.SUPPRESS)
    p.add_argument("--rounds", type=int, help=argparse.SUPPRESS)
    p.add_argument("--warmup", type=int, help=argparse.SUPPRESS)
    p.add_argument("--from-json", metavar="PATH",
                   help="print the tables of a run saved with --json, without measuring")
    args = p.parse_args()
    if args.worker:
        sys.path.insert(0, str(_common.ROOT / "examples"))
        worker(args)
        return
    if args.from_json:
        with open(args.from_json) as f:
            saved = json.load(f)
        print(f"Machine: {saved['machine']}\n\nCommand: {saved.get('command', '?')}\n")
        print(report(saved["results"]))
        return
    machine = _common.machine_description()
    started = time.perf_counter()
    results = []
    for config in CONFIGS[args.quick]:
        res = run_config(*config, clock=args.clock)
        print(f"# {res['model']} x{res['replicas']}: done in {res['wall_s']:.0f} s",
              file=sys.stderr, flush=True)
        results.append(res)
    total = time.perf_counter() - started
    cmd = (f"python benchmarks/step_overhead.py{' --quick' if args.quick else ''}"
           f"{' --clock cpu' if args.clock == 'cpu' else ''} (total {total:.0f} s)")
    print(f"Machine: {machine}\n")
    print(f"Command: {cmd}\n")
    print(report(results))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"machine": machine, "command": cmd, "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
