"""Child process for the collective and checkpoint tests (one replica per process).

Started with the ``ADAPTDL_*`` variables (see ``tests/core/harness.py``); writes what it
observed as JSON into ``<--out>/rank<R>.json`` and exits 0 unless something unexpected
happened. Modes:

``ops``       allreduce (default and custom ``reduce_fn``), several outstanding
              ``allreduce_async`` operations, broadcast, and the errors of initialize.
``timeout``   ranks in ``--absent`` exit right after joining, ranks in ``--hang`` join and
              never call a collective; the others call ``allreduce`` and record the
              ``CollectiveTimeoutError`` (type, message, missing ranks, elapsed seconds).
``hostdies``  rank 0 (the store's host) exits once rank 1 waits inside ``allreduce``;
              rank 1 records the error it gets.
``lastread``  replica 0 leaves right after the last collective while replica 1 is still
              reading its values; replica 1 records the value or the error.
``noread``    ranks in ``--absent`` publish their value and exit before reading the
              result; replica 0 (which must not return before every replica read)
              records the ``CollectiveTimeoutError`` it gets, the other ranks the value.
``ckpt``      a single-process training job (AdaptiveDataParallel, AdaptiveDataLoader,
              Accumulator with numpy and tensor values) that checkpoints itself mid-epoch
              with ``request_checkpoint_and_exit``; records what it expects on disk.
``launch``    runs many of the above at once to save time on small machines: it imports
              torch once, then forks every replica of every scenario listed in
              ``--spec`` (a JSON list of ``{"name", "mode", "replicas", "env", "absent",
              "hang"}``), each scenario on a port held from the start (its replica 0
              keeps it for its store); each replica is a separate process with its own
              ``ADAPTDL_*`` variables and writes into ``<--out>/<name>/``. The exit status
              of every replica goes to ``<--out>/statuses.json``.
"""

import argparse
import json
import os
import sys
import time
import traceback


def write(out, rank, report):
    path = os.path.join(out, f"rank{rank}.json")
    with open(path + ".part", "w") as f:
        json.dump(report, f)
    os.replace(path + ".part", path)


def wait_for(path, limit):
    deadline = time.monotonic() + limit
    while not os.path.exists(path) and time.monotonic() < deadline:
        time.sleep(0.05)


def error_info(exc, start):
    return {"type": type(exc).__name__, "message": str(exc),
            "missing": getattr(exc, "missing_ranks", None),
            "elapsed": time.monotonic() - start}


def mode_ops(args, rank, size):
    from adaptdl_core import collective

    report = {}
    try:
        collective.allreduce(1)
    except RuntimeError as exc:  # several replicas, not initialized yet
        report["not_initialized"] = str(exc)
    collective.initialize()
    report["is_initialized"] = collective.is_initialized()
    report["store_address"] = list(collective.store_address())
    try:
        collective.initialize()
    except RuntimeError as exc:
        report["initialize_twice"] = str(exc)

    report["sum"] = collective.allreduce(rank + 1)
    # Non-commutative reduce functions show the rank order of the fold.
    report["concat"] = collective.allreduce(str(rank), lambda a, b: a + b)
    report["pairs"] = collective.allreduce([rank], lambda a, b: [a, b])
    report["max"] = collective.allreduce({"rank": rank, "v": -rank},
                                         lambda a, b: a if a["v"] >= b["v"] else b)
    # Several outstanding operations complete in submission order, interleaved with a
    # synchronous one, and can be read in any order.
    futures = [collective.allreduce_async([(i, rank)]) for i in range(5)]
    report["sync_between"] = collective.allreduce(10 * rank)
    futures += [collective.allreduce_async({rank: i}, lambda a, b: {**a, **b})
                for i in range(5, 8)]
    report["async"] = [f.result(timeout=60) for f in reversed(futures)][::-1]
    report["broadcast"] = collective.broadcast({"from": rank, "payload": list(range(rank + 3))})
    report["broadcast_none"] = collective.broadcast(None if rank == 0 else "not me")
    report["big"] = len(collective.allreduce(bytes(200_000)))
    # Replica 0 hosts the store: it must outlive the others' reads of the last operation
    # (see mode_lastread), so everyone finishes before anyone tears down.
    barrier(args.out, rank, size, "finished")
    collective.teardown()
    report["after_teardown"] = collective.is_initialized()
    write(args.out, rank, report)


def barrier(out, rank, size, tag, limit=60):
    """Wait until every rank reached this point (through files, free of any timeout)."""
    open(os.path.join(out, f"{tag}{rank}"), "w").close()
    for r in range(size):
        wait_for(os.path.join(out, f"{tag}{r}"), limit)


def mode_timeout(args, rank, size):
    from adaptdl_core import collective

    # Join and start the measured collective together, however late each replica started.
    barrier(args.out, rank, size, "started")
    collective.initialize()
    barrier(args.out, rank, size, "joined")
    absent = [int(r) for r in args.absent.split(",") if r]
    hang = [int(r) for r in args.hang.split(",") if r]
    callers = [r for r in range(size) if r not in absent + hang]
    if rank in absent:
        os._exit(0)
    if rank in hang:
        # Joined, alive, but never calls the collective; leave once the callers reported.
        for r in callers:
            wait_for(os.path.join(args.out, f"rank{r}.json"), 60)
        write(args.out, rank, {"hung": True})
        os._exit(0)
    start = time.monotonic()
    try:
        value = collective.allreduce(rank)
        report = {"type": None, "value": value, "elapsed": time.monotonic() - start}
    except Exception as exc:
        report = error_info(exc, start)
    write(args.out, rank, report)
    if rank == 0:
        # Keep hosting the store until every other caller has its answer.
        for r in callers:
            wait_for(os.path.join(args.out, f"rank{r}.json"), 60)
    os._exit(0)


def mode_hostdies(args, rank, size):
    from adaptdl_core import collective

    barrier(args.out, rank, size, "started")
    collective.initialize()
    barrier(args.out, rank, size, "joined")
    if rank == 0:
        group = collective.current_group()
        key = group.key(0, 1)
        deadline = time.monotonic() + 60
        while not group.store.check([key]) and time.monotonic() < deadline:
            time.sleep(0.02)
        time.sleep(0.3)  # rank 1 is now blocked waiting for rank 0's contribution
        write(args.out, rank, {"left": True})
        os._exit(0)
    start = time.monotonic()
    try:
        collective.allreduce(rank)
        report = {"type": None}
    except Exception as exc:
        report = error_info(exc, start)
    write(args.out, rank, report)
    os._exit(0)


class _SlowReads:
    """A store whose reads come ``delay`` seconds late (a descheduled replica)."""

    def __init__(self, store, delay):
        self._store, self._delay = store, delay

    def multi_get(self, keys):
        time.sleep(self._delay)
        return self._store.multi_get(keys)

    def __getattr__(self, name):
        return getattr(self._store, name)


def mode_lastread(args, rank, size):
    """The job's last collective: replica 0 tears down and exits as soon as it has its
    result, while replica 1 is slow to read the values."""
    from adaptdl_core import collective

    barrier(args.out, rank, size, "started")
    collective.initialize()
    barrier(args.out, rank, size, "joined")
    if rank == 1:
        collective.current_group().store = _SlowReads(collective.current_group().store, 1.0)
    start = time.monotonic()
    try:
        report = {"type": None, "value": collective.allreduce(rank + 1)}
    except Exception as exc:
        report = error_info(exc, start)
    collective.teardown()
    write(args.out, rank, report)
    os._exit(0)


class _ExitOnRead:
    """A store whose reads end the process (a replica that dies after publishing)."""

    def __init__(self, store):
        self._store = store

    def multi_get(self, keys):
        os._exit(0)

    def __getattr__(self, name):
        return getattr(self._store, name)


def mode_noread(args, rank, size):
    from adaptdl_core import collective

    barrier(args.out, rank, size, "started")
    collective.initialize()
    barrier(args.out, rank, size, "joined")
    if rank in [int(r) for r in args.absent.split(",") if r]:
        collective.current_group().store = _ExitOnRead(collective.current_group().store)
    start = time.monotonic()
    try:
        report = {"type": None, "value": collective.allreduce(rank + 1),
                  "elapsed": time.monotonic() - start}
    except Exception as exc:
        report = error_info(exc, start)
    write(args.out, rank, report)
    if rank == 0:
        # Keep hosting the store until the reader that did read has reported.
        for r in range(1, size):
            wait_for(os.path.join(args.out, f"rank{r}.json"), 2)
    os._exit(0)


def mode_ckpt(args, rank, size):
    import numpy as np
    import torch

    import adaptdl_core.torch as adl

    torch.manual_seed(0)
    report = {}
    adl.init_process_group("gloo")
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    ddp = adl.AdaptiveDataParallel(model, opt, sched)
    try:
        adl.AdaptiveDataParallel(torch.nn.Linear(2, 2), "sgd", name="other")
    except ValueError as exc:
        report["adp_bad_optimizer"] = str(exc)
    try:
        adl.init_process_group("gloo")
    except RuntimeError as exc:
        report["init_twice"] = str(exc)

    x = torch.randn(32, 4)
    data = torch.utils.data.TensorDataset(x, x.sum(1, keepdim=True))
    loader = adl.AdaptiveDataLoader(data, batch_size=8, shuffle=True)
    accum = adl.Accumulator()
    n = 0
    np_scalar = 0.0
    np_array = np.zeros(3, dtype=np.int64)
    tensor = 0.0
    try:
        for epoch in adl.remaining_epochs_until(2):
            for i, (xb, yb) in enumerate(loader):
                opt.zero_grad()
                loss = torch.nn.functional.mse_loss(ddp(xb), yb)
                loss.backward()
                opt.step()
                accum["n"] += len(yb)
                accum["np_scalar"] += np.float64(0.25) * len(yb)
                accum["np_array"] += np.arange(3)
                accum["tensor"] += loss.detach()
                n += len(yb)
                np_scalar += 0.25 * len(yb)
                np_array += np.arange(3)
                tensor += float(loss.detach())
                if epoch == 1 and i == 1:
                    adl.request_checkpoint_and_exit()
            with accum.synchronized():
                report.setdefault("epoch_n", []).append(accum["n"])
            sched.step()
        report["error"] = "the job was not interrupted"
    except adl.CheckpointExit as exc:
        report["checkpoint_dir"] = exc.checkpoint_dir
        report["loader_index"] = loader.current_index
    report.update(accum_n=n, np_scalar=np_scalar, np_array=np_array.tolist(), tensor=tensor)
    write(args.out, rank, report)


def run_mode(args, rank, size):
    globals()[f"mode_{args.mode}"](args, rank, size)


def launch(args):
    import signal

    import torch.distributed  # noqa: F401  (imported once, inherited by every replica)

    from adaptdl_core import ports

    with open(args.spec) as f:
        spec = json.load(f)
    # One port per scenario, held from now on; each scenario's replica 0 keeps its own
    # for its store, every other process closes its copies.
    held = {scenario["name"]: ports.HeldPort() for scenario in spec}
    children = {}
    for scenario in spec:
        out = os.path.join(args.out, scenario["name"])
        os.makedirs(out, exist_ok=True)
        for rank in range(scenario["replicas"]):
            sys.stdout.flush()
            sys.stderr.flush()
            pid = os.fork()
            if pid == 0:
                code = 1
                try:
                    for name, port in held.items():
                        if name == scenario["name"] and rank == 0:
                            port.keep_for_store()
                        else:
                            port.close()
                    for key in [k for k in os.environ if k.startswith("ADAPTDL_")]:
                        del os.environ[key]
                    os.environ.update({
                        "ADAPTDL_MASTER_ADDR": "127.0.0.1",
                        "ADAPTDL_MASTER_PORT": str(held[scenario["name"]].port),
                        "ADAPTDL_REPLICA_RANK": str(rank),
                        "ADAPTDL_NUM_REPLICAS": str(scenario["replicas"]),
                    })
                    os.environ.update(scenario.get("env", {}))
                    child_args = argparse.Namespace(
                        mode=scenario["mode"], out=out, absent=scenario.get("absent", ""),
                        hang=scenario.get("hang", ""))
                    run_mode(child_args, rank, scenario["replicas"])
                    code = 0
                except BaseException:
                    print(f"[{scenario['name']} rank {rank}]", flush=True)
                    traceback.print_exc()
                finally:
                    sys.stdout.flush()
                    sys.stderr.flush()
                    os._exit(code)
            children[pid] = (scenario["name"], rank)
    for port in held.values():
        port.close()
    statuses = {name: {} for name in (s["name"] for s in spec)}
    deadline = time.monotonic() + args.limit
    while children:
        pid, status = os.waitpid(-1, os.WNOHANG)
        if pid == 0:
            if time.monotonic() > deadline:
                for pid in children:
                    os.kill(pid, signal.SIGKILL)
                deadline = float("inf")
            time.sleep(0.05)
            continue
        name, rank = children.pop(pid)
        statuses[name][str(rank)] = os.waitstatus_to_exitcode(status)
    with open(os.path.join(args.out, "statuses.json"), "w") as f:
        json.dump(statuses, f)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("mode", choices=["ops", "timeout", "hostdies", "lastread", "noread", "ckpt",
                                      "launch"])
    p.add_argument("--out", required=True)
    p.add_argument("--absent", default="")
    p.add_argument("--hang", default="")
    p.add_argument("--spec", help="launch: JSON list of scenarios")
    p.add_argument("--limit", type=float, default=60.0,
                   help="launch: seconds before the remaining replicas are killed")
    args = p.parse_args()

    if args.mode == "launch":
        launch(args)
        return 0

    from adaptdl_core import env

    rank, size = env.replica_rank(), env.num_replicas()
    try:
        run_mode(args, rank, size)
    except BaseException:
        traceback.print_exc()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
