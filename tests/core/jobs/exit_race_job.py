"""Replicas that end with ``os._exit`` right after their last collective, many times over.

``os._exit`` skips atexit, so :func:`adaptdl_core.collective.teardown` never runs: replica
0's store lives exactly as long as its process. Every replica of every round runs a few
``allreduce`` calls, checks their values and exits at once with status 0 (or 1, with the
traceback on stderr, if a collective failed or returned a wrong value); rank 0's exit
takes the store down. A collective that returned on replica 0 before every replica had
read its result shows up as ``CollectiveError ... Connection reset by peer`` on another
rank.

This process imports torch once, then forks the replicas of every round at once (a few
milliseconds each; each round has its own port, held from the start). Prints one JSON
line: ``{"rounds", "failures": [[round, rank, status], ...], "elapsed"}``.
"""

import argparse
import json
import os
import sys
import time
import traceback

from adaptdl_core import ports


def replica(port, rank, size, ops):
    from adaptdl_core import collective

    code = 1
    try:
        collective.initialize(master_addr="127.0.0.1", master_port=port, replica_rank=rank,
                              num_replicas=size, timeout=20)
        for i in range(ops):
            value = collective.allreduce(rank + i)
            expected = sum(range(size)) + size * i
            if value != expected:
                raise AssertionError(f"op {i}: got {value}, expected {expected}")
        code = 0
    except BaseException:
        traceback.print_exc()
        sys.stderr.flush()
    os._exit(code)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=16)
    p.add_argument("--replicas", type=int, default=3)
    p.add_argument("--ops", type=int, default=3)
    args = p.parse_args()

    import torch.distributed  # noqa: F401  (imported once, inherited by every replica)

    start = time.monotonic()
    failures = []
    # All rounds at once: more chances for a slow reader (the race this checks), and the
    # wall time stays that of one round even where a TCP connect now and then stalls for
    # seconds (seen in sandboxed test machines, with or without this fix).
    # One port per round, held from now on (nothing else can take it, the replicas' own
    # connections included); each round's replica 0 keeps its own for its store, every
    # other process closes its copies.
    held = [ports.HeldPort() for _ in range(args.rounds)]
    children = {}
    for round_, port in enumerate(held):
        for rank in range(args.replicas):
            sys.stdout.flush()
            sys.stderr.flush()
            pid = os.fork()
            if pid == 0:
                for other in held:
                    if other is port and rank == 0:
                        other.keep_for_store()
                    else:
                        other.close()
                replica(port.port, rank, args.replicas, args.ops)
            children[pid] = (round_, rank)
    for port in held:
        port.close()
    while children:
        pid, status = os.waitpid(-1, 0)
        round_, rank = children.pop(pid)
        code = os.waitstatus_to_exitcode(status)
        if code != 0:
            failures.append([round_, rank, code])
    print(json.dumps({"rounds": args.rounds, "failures": failures,
                      "elapsed": time.monotonic() - start}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
