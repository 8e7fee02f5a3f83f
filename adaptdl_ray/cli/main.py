"""The ``adaptdl-ray`` argument parser (one sub-command per verb) and its entry point."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from typing import Any, Sequence

from adaptdl_ray.cli.allocator_verbs import cmd_start, cmd_status
from adaptdl_ray.cli.errors import PROG, CliError
from adaptdl_ray.cli.job_verbs import cmd_cp, cmd_logs, cmd_stop, cmd_submit, cmd_tensorboard
from adaptdl_ray.cli.listing import cmd_ls
from adaptdl_ray.cluster.elastic_job import DEFAULT_STOP_TIMEOUT_S, add_job_arguments

__all__ = ["build_parser", "main"]

_FORCE_HELP = "act on another person's job too (jobs record who submitted them)"


def build_parser() -> argparse.ArgumentParser:
    """The ``adaptdl-ray`` argument parser (one sub-command per verb)."""
    parser = argparse.ArgumentParser(
        prog=PROG, description="Elastic AdaptDL jobs on a Ray cluster (Ray Job Submission).")
    verbs = parser.add_subparsers(dest="verb", metavar="VERB", required=True)
    cluster = argparse.ArgumentParser(add_help=False)
    cluster.add_argument("--address", default=None, metavar="ADDR",
                         help="the cluster: its dashboard URL http://HEAD:8265, its GCS "
                              "address HEAD:6379, ray://HEAD:10001 or auto (default: "
                              "RAY_API_SERVER_ADDRESS or RAY_ADDRESS, else the local "
                              "cluster)")

    def verb(name: str, fn: Any, text: str) -> argparse.ArgumentParser:
        sub = verbs.add_parser(name, parents=[cluster], help=text, description=text)
        sub.set_defaults(fn=fn)
        return sub

    submit = verb("submit", cmd_submit, "run a training script as an elastic job (the same "
                  "--name again resumes a stopped job)")
    add_job_arguments(submit)
    submit.add_argument("--working-dir", default=None, metavar="DIR",
                        help="directory uploaded with the job (default: the script's own)")
    submit.add_argument("--stop-timeout", type=float, default=DEFAULT_STOP_TIMEOUT_S,
                        metavar="S", help="seconds a stop or resize waits for a batch "
                                          f"boundary (default {DEFAULT_STOP_TIMEOUT_S:g})")
    submit.add_argument("--force", action="store_true", help="resume another person's job "
                                                             "of that name")
    submit.add_argument("script", metavar="SCRIPT", help="the training script")
    submit.add_argument("args", nargs=argparse.REMAINDER, metavar="ARGS",
                        help="the script's own arguments")

    ls = verb("ls", cmd_ls, "list the AdaptDL jobs and trials on the cluster")
    ls.add_argument("--json", action="store_true", help="print a JSON list of objects")
    ls.add_argument("--wide", action="store_true",
                    help="also each job's target share, maximum and epochs")

    logs = verb("logs", cmd_logs, "print a job's output")
    logs.add_argument("name", metavar="NAME")
    logs.add_argument("-f", "--follow", action="store_true", help="follow until the job ends")
    logs.add_argument("--all", action="store_true", help="every submission's, oldest first")

    stop = verb("stop", cmd_stop, "checkpoint a job at its next batch boundary and stop it")
    stop.add_argument("name", metavar="NAME")
    stop.add_argument("--timeout", type=float, default=DEFAULT_STOP_TIMEOUT_S + 60,
                      metavar="S", help="seconds to wait for the stop")
    stop.add_argument("--force", action="store_true", help=_FORCE_HELP)

    cp = verb("cp", cmd_cp, "copy a job's latest checkpoint to DEST")
    cp.add_argument("name", metavar="NAME")
    cp.add_argument("dest", metavar="DEST", help="a new directory, or an existing one to "
                                                 "copy into")
    cp.add_argument("--storage-path", default=None, metavar="P",
                    help="read the job from this storage path (no cluster needed)")
    cp.add_argument("--force", action="store_true", help=_FORCE_HELP)

    tb = verb("tensorboard", cmd_tensorboard, "run TensorBoard on a job's event files")
    tb.add_argument("name", metavar="NAME")
    tb.add_argument("--port", type=int, default=6006)
    tb.add_argument("--storage-path", default=None, metavar="P",
                    help="read the job from this storage path (no cluster needed)")

    subs = {}
    for name, fn, text in (("start", cmd_start, "start the cluster allocator (and turn its "
                                                "autoscaling on or off)"),
                           ("status", cmd_status, "show the cluster allocator's state")):
        subs[name] = verb(name, fn, text)
        subs[name].add_argument("--namespace", default=None,
                                help="the allocator's Ray namespace (default: "
                                     "$ADAPTDL_RAY_NAMESPACE, else adaptdl)")
    subs["status"].add_argument("--json", action="store_true",
                                help="all of the allocator's state, as JSON")
    start = subs["start"]
    start.add_argument("--policy", default=None, metavar="NAME",
                       help="the allocator's policy, when it starts: pollux (default) or "
                            "adaptdl (weighs remaining work; on nodes of several "
                            "accelerator types, places each job on one type)")
    start.add_argument("--autoscale", action="store_true",
                       help="ask Ray's autoscaler for the nodes Pollux's goodput rule wants")
    start.add_argument("--no-autoscale", action="store_true",
                       help="stop autoscaling and withdraw the standing request")
    start.add_argument("--min-nodes", type=int, default=None, metavar="N",
                       help="fewest nodes of the template the cluster keeps")
    start.add_argument("--max-nodes", type=int, default=None, metavar="N",
                       help="most nodes of the template")
    start.add_argument("--node-template", default=None, metavar="JSON",
                       help="the resources of one node to add, e.g. '{\"CPU\": 8, \"GPU\": 1}'")
    start.add_argument("--baseline-nodes", type=int, default=None, metavar="N",
                       help="template nodes the cluster keeps without asking (Ray's "
                            "min_workers, plus the head if it has the template's shape); "
                            "wanting no more withdraws the request (default 0)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``adaptdl-ray``; returns the exit status (0 done, 1 error, 2 bad usage)."""
    parser = build_parser()
    opts = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format=f"{PROG}: %(message)s")
    try:
        return opts.fn(opts)
    except CliError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 1
    except BrokenPipeError:
        # The reader of the output went away (`adaptdl-ray ls | head`): stop quietly, as
        # other tools do, and keep the interpreter's last flush from failing again.
        try:
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        except (OSError, ValueError):
            pass  # (an output with no file descriptor: nothing left to flush there)
        return 141
    except (RuntimeError, ConnectionError) as exc:
        # Ray's Job Submission client raises these for a dashboard that fails a request.
        text = " ".join(str(exc).split())
        if not isinstance(exc, ConnectionError) and not text.startswith("Request failed"):
            raise
        print(f"{PROG}: error: the cluster's Job Submission API failed: {text} (see the "
              "dashboard's log, dashboard.log in the head node's Ray session directory)",
              file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
