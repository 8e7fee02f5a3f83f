"""How much faster 2 replicas train an epoch than 1, for the HyperOpt example's model.

The main example (``examples/hyperopt_example.py``) is meant to show a resize that pays on
a 2-core machine; this measures whether a second replica pays at all, side by side: the
example's ``SetMLP`` (an MLP on each of 8 vectors per sample) and a plain 64-512-512-2 MLP
on one vector per sample, at fixed global batch sizes, each on 1 and 2 one-thread replicas
started with ``adaptdl_core.launch``'s environment (gloo on this machine), median epoch
time of ``--epochs`` epochs after one warm-up epoch.

    python benchmarks/replica_speedup.py            # about 3 minutes on 2 cores
    python benchmarks/replica_speedup.py --quick    # one batch size per model
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

from _common import ROOT, emit_result, launch_job, markdown_table, parse_result

EXAMPLES = os.path.join(str(ROOT), "examples")


def worker(args: argparse.Namespace) -> None:
    """One replica: train ``args.epochs + 1`` epochs of ``args.model`` at global batch
    ``args.batch``; rank 0 emits the epoch times (the first, a warm-up, dropped)."""
    import torch

    import adaptdl_core.torch as adl
    from adaptdl_core import env
    sys.path.insert(0, EXAMPLES)
    from mlp_data import NUM_FEATURES, SetMLP, load_mlp_datasets

    torch.set_num_threads(1)
    torch.manual_seed(0)
    adl.init_process_group("gloo")
    train, _ = load_mlp_datasets()
    if args.model == "plain":  # one vector per sample: the set's first
        x, y = train.tensors
        train = torch.utils.data.TensorDataset(x[:, 0].contiguous(), y)
        net = torch.nn.Sequential(torch.nn.Linear(NUM_FEATURES, 512), torch.nn.ReLU(),
                                  torch.nn.Linear(512, 512), torch.nn.ReLU(),
                                  torch.nn.Linear(512, 2))
    else:
        net = SetMLP()
    optimizer = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9)
    model = adl.AdaptiveDataParallel(net, optimizer)
    loader = adl.AdaptiveDataLoader(train, batch_size=args.batch, shuffle=True,
                                    drop_last=True)
    times = []
    for _ in adl.remaining_epochs_until(args.epochs + 1):
        start = time.perf_counter()
        for xb, yb in loader:
            optimizer.zero_grad()
            torch.nn.functional.cross_entropy(model(xb), yb).backward()
            optimizer.step()
        times.append(time.perf_counter() - start)
    if env.replica_rank() == 0:
        emit_result({"epoch_s": times[1:]})


def main() -> None:
    """Run every case on 1 and 2 replicas and print the table (or be one replica)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="one batch size per model")
    p.add_argument("--epochs", type=int, default=3, help="timed epochs per run (default 3)")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--model", choices=("set", "plain"), help=argparse.SUPPRESS)
    p.add_argument("--batch", type=int, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        worker(args)
        return
    cases = [("set", 128), ("plain", 1024)] if args.quick else \
        [("set", 64), ("set", 128), ("set", 256), ("plain", 256), ("plain", 1024)]
    rows = []
    for model, batch in cases:
        epoch_s = {}
        for replicas in (1, 2):
            out = launch_job(__file__, ["--worker", "--model", model, "--batch", str(batch),
                                        "--epochs", str(args.epochs)], replicas)
            status, text = out[0]
            if status != 0:
                raise RuntimeError(f"{model} x{replicas} failed:\n{text[-3000:]}")
            epoch_s[replicas] = statistics.median(parse_result(text)["epoch_s"])
        rows.append([model, batch, f"{epoch_s[1]:.2f}", f"{epoch_s[2]:.2f}",
                     f"{epoch_s[1] / epoch_s[2]:.2f}"])
    print(markdown_table(["model", "global batch", "epoch s, 1 replica",
                          "epoch s, 2 replicas", "speedup"], rows))


if __name__ == "__main__":
    main()
