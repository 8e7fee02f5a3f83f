"""A replica that only joins the job (``adaptdl_core.torch.init_process_group``) and
writes what happened as JSON into ``<--out>/rank<R>.json``: the error's type, message,
missing and joined ranks, and the times (``time.monotonic()``, one clock for every
process of the machine, the one the rendezvous deadline is set on) when it began to join
and when the call returned or raised. It then exits through the interpreter's normal exit
(atexit handlers included); ``<--out>/rank<R>.exit`` holds the time when every exit handler
had run, so that the test can time the library's part of the exit apart from the
interpreter's teardown."""

import argparse
import atexit
import json
import os
import sys
import time


def write(out, rank, report):
    with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
        json.dump(report, f)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--then", choices=["exit", "die"], default="exit",
                   help="die: after joining, the last rank dies (os._exit(7)) and the others "
                        "run an all_reduce, record its error and re-raise it uncaught")
    args = p.parse_args()
    rank = int(os.environ["ADAPTDL_REPLICA_RANK"])

    def exit_handlers_done():
        # Registered first, so it runs after every other exit handler (the library's):
        # what is left of the exit then is the interpreter's own teardown.
        with open(os.path.join(args.out, f"rank{rank}.exit"), "w") as f:
            f.write(repr(time.monotonic()))

    atexit.register(exit_handlers_done)
    import torch
    import torch.distributed as dist

    import adaptdl_core.torch as adl
    from adaptdl_core import env

    report = {"began": time.monotonic()}
    try:
        adl.init_process_group("gloo")
        report["type"] = None
    except Exception as exc:
        report.update(type=type(exc).__name__, message=str(exc),
                      missing=getattr(exc, "missing_ranks", None),
                      joined=getattr(exc, "joined_ranks", None))
    report["raised"] = time.monotonic()
    if report["type"] is not None or args.then == "exit":
        write(args.out, rank, report)
        return 0 if report["type"] is None else 1
    if rank == env.num_replicas() - 1:
        write(args.out, rank, report)
        os._exit(7)
    try:
        dist.all_reduce(torch.ones(1))
        report["type"] = None
    except Exception as exc:
        report.update(type=type(exc).__name__, message=str(exc).splitlines()[0])
        report["raised"] = time.monotonic()
        write(args.out, rank, report)
        raise
    write(args.out, rank, report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
