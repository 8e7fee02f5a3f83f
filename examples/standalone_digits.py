"""Elastic training of a small CNN on scikit-learn's digits, with adaptdl_core.torch.

The digits version of AdaptDL's MNIST tutorial (step 5). It runs

* as one process:                 python examples/standalone_digits.py
* as several processes (replicas), each started with ADAPTDL_NUM_REPLICAS,
  ADAPTDL_REPLICA_RANK, ADAPTDL_MASTER_ADDR and ADAPTDL_MASTER_PORT set;

and with ADAPTDL_CHECKPOINT_PATH set it can be stopped at any batch (Ctrl-C or
``kill -INT`` on any replica: every replica exits with status 143 after replica 0 has
written a checkpoint) and resumed by starting it again with the same checkpoint path, on
any number of replicas. At the end it saves its final state, marked finished: started
again, it trains nothing. See examples/README.md for the exact commands.

Compared with a plain PyTorch script, the changes are:
  1. adl.init_process_group("gloo") before anything else touches the job;
  2. the model is wrapped in adl.AdaptiveDataParallel(model, optimizer, lr_scheduler),
     which restores all three after a restart;
  3. the DataLoaders are adl.AdaptiveDataLoaders (batch_size is the *global* batch);
  4. the epoch loop is `for epoch in adl.remaining_epochs_until(epochs)`;
  5. metrics are summed in an adl.Accumulator and read in `with accum.synchronized()`.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time

import torch

import adaptdl_core.torch as adl
from adaptdl_core import checkpoint, env

# Make `import digits_data` work however the script is started.
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from digits_data import DigitsCNN, evaluate, load_digits_datasets, train_epoch  # noqa: E402

log = logging.getLogger("standalone_digits")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--epochs", type=int, default=10, help="epochs to train (default 10)")
    p.add_argument("--batch-size", type=int, default=64,
                   help="global batch size, shared by all replicas (default 64)")
    p.add_argument("--lr", type=float, default=0.05, help="initial learning rate")
    p.add_argument("--momentum", type=float, default=0.9, help="SGD momentum")
    p.add_argument("--seed", type=int, default=0, help="seed of the model initialisation")
    p.add_argument("--log-every", type=int, default=0, metavar="N",
                   help="also log the training loss every N batches (default: per epoch)")
    p.add_argument("--num-threads", type=int, default=1,
                   help="torch CPU threads per replica (default 1)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> float | None:
    args = parse_args(argv)
    # Replica 0 reports progress; the others only warnings (e.g. "received SIGINT").
    logging.basicConfig(
        level=logging.INFO if env.replica_rank() == 0 else logging.WARNING,
        format=f"%(asctime)s rank{env.replica_rank()} %(name)s: %(message)s",
        datefmt="%H:%M:%S")
    torch.set_num_threads(args.num_threads)
    torch.manual_seed(args.seed)

    # Join the job: one process needs no ADAPTDL_* variables. From here on, SIGINT and
    # SIGTERM mean "checkpoint at the next batch and exit with status 143".
    adl.init_process_group("gloo")
    replicas = env.num_replicas()

    train_dataset, test_dataset = load_digits_datasets()
    model = DigitsCNN()
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum)
    lr_scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=args.epochs)
    # Restores model, optimizer and scheduler from the checkpoint, if there is one.
    model = adl.AdaptiveDataParallel(model, optimizer, lr_scheduler)

    # batch_size is global: each of the R replicas loads ceil(batch_size / R) samples.
    train_loader = adl.AdaptiveDataLoader(train_dataset, batch_size=args.batch_size,
                                          shuffle=True, drop_last=True)
    # The test loader keeps its last, partial batch; when the images left do not split
    # evenly among the replicas, it is padded with a few repeated ones (so the accuracy
    # may count a handful twice; 360 test images split evenly among 1 to 6 replicas).
    test_loader = adl.AdaptiveDataLoader(test_dataset, batch_size=256)
    # Sums over replicas, and survives restarts (pending sums go into the checkpoint).
    accum = adl.Accumulator()

    if checkpoint.latest_checkpoint_dir() is not None:
        log.info("resuming at epoch %d on %d replica(s) (restart %d)",
                 adl.finished_epochs(), replicas, env.num_restarts())
    log.info("training on %d replica(s): %d train / %d test images, global batch %d, "
             "%d epochs", replicas, len(train_dataset), len(test_dataset), args.batch_size,
             args.epochs)

    accuracy = None
    start = time.perf_counter()
    # After a restart the loop starts at the interrupted epoch, and the train loop below
    # continues at the interrupted sample (or is skipped if it had finished).
    for epoch in adl.remaining_epochs_until(args.epochs):
        train_epoch(model, optimizer, train_loader, accum, log_every=args.log_every,
                    epoch=epoch)
        evaluate(model, test_loader, accum)

        # A collective: every replica enters, and sees the same sums of all replicas.
        with accum.synchronized():
            train_loss = accum["train_loss"] / accum["train_n"]
            accuracy = accum["correct"] / accum["test_n"]
            accum.clear()
        log.info("epoch %d: train loss %.4f, test accuracy %.4f, lr %.4f (%.1f s)", epoch,
                 train_loss, accuracy, lr_scheduler.get_last_lr()[0],
                 time.perf_counter() - start)

        # Step the scheduler at the END of the epoch body. After a restart, code just
        # before the epoch loop or before a loader loop runs again (the job resumes in
        # the middle of the epoch), so a step placed there would be applied twice. No
        # restart can happen between here and the end of the epoch.
        lr_scheduler.step()

    # A job that had finished (its newest checkpoint is the end of training) runs no
    # epoch: remaining_epochs_until logged "job already finished (N epochs); nothing to
    # do", and there is no new accuracy to print.
    if accuracy is not None and env.replica_rank() == 0:
        print(f"final test accuracy: {accuracy:.4f}", flush=True)
    return accuracy


if __name__ == "__main__":
    main()
