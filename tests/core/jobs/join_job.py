"""A replica that only joins the job (``adaptdl_core.torch.init_process_group``) and
writes what happened as JSON into ``<--out>/rank<R>.json``: the error's type, message,
missing and joined ranks, and the wall-clock time (``time.time()``) when it began to
join. It then exits through the interpreter's normal exit (atexit handlers included), so
that the test can time the whole exit, not only the error."""

import argparse
import json
import os
import sys
import time


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    args = p.parse_args()
    import adaptdl_core.torch as adl
    from adaptdl_core import env

    rank = env.replica_rank()
    report = {"began": time.time()}
    try:
        adl.init_process_group("gloo")
        report["type"] = None
    except Exception as exc:
        report.update(type=type(exc).__name__, message=str(exc),
                      missing=getattr(exc, "missing_ranks", None),
                      joined=getattr(exc, "joined_ranks", None))
    report["raised"] = time.time()
    with open(os.path.join(args.out, f"rank{rank}.json"), "w") as f:
        json.dump(report, f)
    return 0 if report["type"] is None else 1


if __name__ == "__main__":
    sys.exit(main())
