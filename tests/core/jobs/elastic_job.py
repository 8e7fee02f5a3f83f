"""A small elastic training job used by the multi-process tests.

It trains a linear model on a synthetic dataset whose items carry their own index, and
writes what it observes into ``--record`` (one JSON line per event and replica):
the sample indices of every training batch, accumulator results, the epochs it ran and,
on rank 0 at the end, the final parameters. Options make it interrupt itself after a
number of batches, ask for in-place checkpoints (``request_checkpoint``) or kill one
replica, so tests can exercise restarts and failures. Logs at INFO level.
"""

import argparse
import dataclasses
import json
import logging
import os
import sys
import threading
import time

import torch

import adaptdl_core.env as env
import adaptdl_core.torch as adl


class IndexedData(torch.utils.data.Dataset):
    def __init__(self, size: int, noise: float = 0.1):
        g = torch.Generator().manual_seed(1234)
        self.x = torch.randn(size, 4, generator=g)
        self.y = self.x @ torch.tensor([1.0, -2.0, 0.5, 3.0]) + noise * torch.randn(size, generator=g)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return i, self.x[i], self.y[i]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--record", required=True)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--size", type=int, default=96)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--stop-after", type=int, default=-1,
                   help="rank --stop-rank requests a checkpoint-exit after this many batches")
    p.add_argument("--stop-rank", type=int, default=0)
    p.add_argument("--stop-when-grown", action="store_true",
                   help="rank --stop-rank requests a checkpoint-exit after the first batch "
                        "at a batch size above --batch-size")
    p.add_argument("--die-after", type=int, default=-1,
                   help="rank --die-rank exits abruptly (status 7) after this many batches")
    p.add_argument("--die-rank", type=int, default=1)
    p.add_argument("--signal-file", default=None,
                   help="touch this file after the first batch (tests send signals then)")
    p.add_argument("--autoscale", type=int, default=0, help="max batch size (0: fixed)")
    p.add_argument("--accumulation", action="store_true")
    p.add_argument("--drop-last", action="store_true")
    p.add_argument("--noise", type=float, default=0.1, help="label noise (std)")
    p.add_argument("--sleep", type=float, default=0.0, help="seconds per batch")
    p.add_argument("--slow-until", default=None,
                   help="sleep --sleep per batch only until this file exists (a test's "
                        "scripted policy touches it once it has run its script)")
    p.add_argument("--record-node", action="store_true",
                   help="the start record names the Ray node the replica runs on")
    p.add_argument("--sleep-per-sample", type=float, default=0.0,
                   help="seconds per sample of the local batch: a step's time scales with it, "
                        "as a compute-bound model's does (more replicas pay)")
    p.add_argument("--hold-after", type=int, default=-1,
                   help="after this many batches, rank --hold-rank (-1: every rank) "
                        "touches <--record>/held-r<restart>-rank<rank> and waits (up to "
                        "120 s) until a stop is requested (a test sends its signal then)")
    p.add_argument("--hold-rank", type=int, default=-1)
    p.add_argument("--save-after", type=int, default=-1,
                   help="rank --save-rank (-1: every rank) calls request_checkpoint "
                        "--save-requests times after this many batches")
    p.add_argument("--save-rank", type=int, default=0)
    p.add_argument("--save-requests", type=int, default=1)
    p.add_argument("--save-from-thread", action="store_true",
                   help="make the requests from another thread, while training goes on")
    p.add_argument("--save-in-valid", action="store_true",
                   help="count --save-after in validation batches instead (no "
                        "AdaptiveDataParallel step there: the store path agrees)")
    p.add_argument("--late-save", action="store_true",
                   help="request a checkpoint after training (no boundary follows), then "
                        "cancel it")
    args = p.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(name)s %(levelname)s %(message)s")

    torch.manual_seed(0)
    adl.init_process_group("gloo")
    rank, restart = env.replica_rank(), env.num_restarts()
    log = open(os.path.join(args.record, f"r{restart}-rank{rank}.jsonl"), "a", buffering=1)

    def emit(**event):
        log.write(json.dumps(event) + "\n")

    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.9)
    model = adl.AdaptiveDataParallel(model, opt, sched)
    data = IndexedData(args.size, args.noise)
    train = adl.AdaptiveDataLoader(data, batch_size=args.batch_size, shuffle=True,
                                   drop_last=args.drop_last)
    if args.autoscale:
        train.autoscale_batch_size(args.autoscale, local_bsz_bounds=(4, 64),
                                   gradient_accumulation=args.accumulation)
    valid = adl.AdaptiveDataLoader(data, batch_size=args.batch_size)
    accum = adl.Accumulator()
    where = {}
    if args.record_node:
        import ray
        where["node"] = ray.get_runtime_context().get_node_id()
    emit(event="start", replicas=env.num_replicas(), epoch=adl.finished_epochs(), pid=os.getpid(),
         **where)

    requests, askers = [], []

    def ask():
        requests.extend(adl.request_checkpoint() for _ in range(args.save_requests))

    def emit_requests():
        # (From the main thread only: the record file is not shared between threads.)
        for t in askers:
            t.join()
        for request in requests:
            request.wait(20)
            emit(event="save", done=request.done, taken=request.taken, path=request.path)

    try:
        train_epochs(args, rank, model, opt, sched, train, valid, accum, emit, ask, askers)
    except adl.CheckpointExit:
        emit_requests()
        raise
    emit_requests()
    if args.late_save:
        request = adl.request_checkpoint()
        waited = request.wait(0.2)
        done = request.done
        cancelled = request.cancel()
        emit(event="late_save", waited=waited, done_before_cancel=done, cancelled=cancelled,
             done=request.done, taken=request.taken, cancel_again=request.cancel())

    if rank == 0:
        torch.save({k: v.detach().clone() for k, v in model.module.state_dict().items()},
                   os.path.join(args.record, "final.pt"))
    emit(event="done")
    return 0


def hold(record, rank):
    """Say that this replica holds at a known batch, then wait for a stop request."""
    open(os.path.join(record, f"held-r{env.num_restarts()}-rank{rank}"), "w").close()
    deadline = time.monotonic() + 120
    while not adl.exit_requested() and time.monotonic() < deadline:
        time.sleep(0.01)


def train_epochs(args, rank, model, opt, sched, train, valid, accum, emit, ask, askers):
    batches = valid_batches = 0

    def maybe_ask(count):
        if count == args.save_after and args.save_rank in (-1, rank):
            if args.save_from_thread:
                askers.append(threading.Thread(target=ask))
                askers[-1].start()
            else:
                ask()

    for epoch in adl.remaining_epochs_until(args.epochs):
        for idx, x, y in train:
            opt.zero_grad()
            loss = torch.nn.functional.mse_loss(model(x).squeeze(1), y)
            loss.backward()
            opt.step()
            accum["train_loss"] += loss.item() * len(idx)
            accum["train_n"] += len(idx)
            emit(event="batch", epoch=epoch, idx=idx.tolist(), local_bsz=len(idx),
                 index=train.current_index, **{"pass": train.current_index // args.size},
                 batch_size=train.current_batch_size,
                 accum=train.accumulation_steps, gain=model.gain)
            batches += 1
            if batches == 1 and args.signal_file and rank == 0:
                open(args.signal_file, "w").close()
            if (args.sleep or args.sleep_per_sample) and not (
                    args.slow_until and os.path.exists(args.slow_until)):
                time.sleep(args.sleep + args.sleep_per_sample * len(idx))
            if batches == args.hold_after and args.hold_rank in (-1, rank):
                hold(args.record, rank)
            grown = args.stop_when_grown and train.current_batch_size > args.batch_size
            if not args.save_in_valid:
                maybe_ask(batches)
            if (batches == args.stop_after or grown) and rank == args.stop_rank:
                adl.request_checkpoint_and_exit()
            if batches == args.die_after and rank == args.die_rank:
                os._exit(7)
        with torch.no_grad():
            for idx, x, y in valid:
                accum["valid_sq"] += ((model(x).squeeze(1) - y) ** 2).sum().item()
                accum["valid_n"] += len(idx)
                valid_batches += 1
                if args.save_in_valid:
                    maybe_ask(valid_batches)
        with accum.synchronized():
            emit(event="epoch_end", epoch=epoch, results=dict(accum),
                 progress=dataclasses.asdict(adl.data_progress()))
            accum.clear()
        sched.step()


if __name__ == "__main__":
    sys.exit(main())
