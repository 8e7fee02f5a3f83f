"""Which replica a trial's error blames, from the replicas' failure records (no Ray)."""

from __future__ import annotations

import pytest
import torch.distributed as dist

from adaptdl_core.collective import CollectiveError, CollectiveTimeoutError
from adaptdl_ray.replicas.failures import (ReplicaFailure, exception_record, failure_message,
                                       first_in_cause)


def raised(exc: BaseException, cause: BaseException | None = None) -> BaseException:
    """``exc`` as caught after ``raise exc from cause`` (with its traceback)."""
    try:
        raise exc from cause
    except BaseException as caught:  # noqa: BLE001 - the test wants the exception object
        return caught


def failure(rank: int, exc: BaseException | None, at: float | None = None) -> ReplicaFailure:
    """Replica ``rank``'s failure: its exception caught at ``at``, or (``None``) it died."""
    if exc is None:
        return ReplicaFailure(rank, f"10.0.0.{rank}", died=True, text="actor died")
    outcome = {"status": "error", "traceback": str(exc), **exception_record(exc, at)}
    return ReplicaFailure.from_outcome(rank, f"10.0.0.{rank}", outcome)


def test_the_record_names_the_exception_its_bases_and_what_it_was_raised_from():
    exc = raised(CollectiveError("store gone"), ConnectionResetError("reset"))
    record = exception_record(exc, 12.5)
    assert record["error_type"] == "adaptdl_core.collective.CollectiveError"
    assert record["failed_at"] == 12.5
    types = record["error_types"]
    assert types[:2] == ["adaptdl_core.collective.CollectiveError", "builtins.RuntimeError"]
    assert "builtins.ConnectionResetError" in types and "builtins.ConnectionError" in types
    assert "builtins.object" not in types


def test_a_context_is_followed_unless_suppressed():
    def caught(suppress: bool) -> BaseException:
        try:
            try:
                raise ConnectionResetError("reset")
            except ConnectionError:
                if suppress:
                    raise ValueError("mine") from None
                raise ValueError("mine")
        except ValueError as exc:
            return exc

    assert "builtins.ConnectionResetError" in exception_record(caught(False), 0.0)["error_types"]
    assert exception_record(caught(True), 0.0)["error_types"] == \
        ["builtins.ValueError", "builtins.Exception", "builtins.BaseException"]


@pytest.mark.parametrize("echo", [
    ConnectionResetError("Connection reset by peer"),
    BrokenPipeError("Broken pipe"),
    TimeoutError("no answer"),
    CollectiveTimeoutError("replica 1 did not reach collective #3", [1]),
    dist.DistNetworkError("client socket timed out"),
    raised(CollectiveError("collective #4 failed"), dist.DistStoreError("gone")),
])
def test_a_user_error_is_blamed_over_a_lost_peer_even_one_caught_before_it(echo):
    # Rank 0's lost-peer error is caught first and has the lower rank: the type decides.
    user = failure(1, raised(ValueError("bad batch")), at=20.0)
    cause = first_in_cause([failure(0, echo, at=10.0), user])
    assert cause.rank == 1 and not cause.lost_peer


def test_a_dead_process_is_blamed_over_any_error():
    cause = first_in_cause([failure(0, raised(ValueError("x")), at=1.0), failure(1, None)])
    assert cause.rank == 1 and cause.died


def test_two_errors_of_no_lost_peer_type_blame_the_first_caught():
    # Gloo reports a lost peer as a plain RuntimeError: only the time tells it apart.
    gloo = raised(RuntimeError("[gloo/transport/tcp/pair.cc] Connection closed by peer"))
    user = raised(RuntimeError("CUDA out of memory"))
    assert first_in_cause([failure(0, gloo, at=5.2), failure(1, user, at=5.0)]).rank == 1
    assert first_in_cause([failure(0, gloo, at=4.9), failure(1, user, at=5.0)]).rank == 0


def test_an_outcome_without_a_record_counts_as_no_lost_peer_at_an_unknown_time():
    old = ReplicaFailure.from_outcome(1, "n", {"status": "error", "traceback": "tb"})
    assert (old.error_types, old.failed_at, old.lost_peer) == ((), None, False)
    echo = failure(0, ConnectionResetError("reset"), at=1.0)
    assert first_in_cause([echo, old]).rank == 1  # its type is unknown: not an echo


def test_ties_go_to_the_lowest_rank_and_no_failures_is_an_error():
    echo = ConnectionResetError("reset")
    assert first_in_cause([failure(2, echo, 1.0), failure(1, echo, 1.0)]).rank == 1
    with pytest.raises(ValueError, match="failures must name at least one"):
        first_in_cause([])


def test_the_message_names_the_replica_and_the_others():
    dead = failure(1, None)
    assert failure_message(dead, "replica 1 of 2 on node 10.0.0.1", [0]) == \
        "replica 1 of 2 on node 10.0.0.1 died (replicas [0] failed after it): actor died"
    err = failure(0, raised(ValueError("bad")), at=1.0)
    assert failure_message(err, "replica 0 of 1", []) == "replica 0 of 1 failed:\nbad"


def test_a_replica_worker_reports_its_failure_as_a_record(tmp_path):
    """The worker (run in this process, as InProcessReplica does) returns the record."""
    from adaptdl_ray.replicas.worker import ReplicaWorker

    def fn(config):
        try:
            raise ConnectionRefusedError("peer gone")
        except ConnectionError as exc:
            raise CollectiveError("collective #1 failed") from exc

    worker = ReplicaWorker(0, {})
    env = {"ADAPTDL_REPLICA_RANK": "0", "ADAPTDL_NUM_REPLICAS": "1", "ADAPTDL_JOB_ID": "t"}
    world = {"world_rank": 0, "world_size": 1, "local_rank": 0, "local_world_size": 1,
             "node_rank": 0}
    try:
        outcome = worker.run(fn, {}, {}, env, None, None, 1, world)
    finally:
        worker.recycle({})  # forgets the job as a new process would (session, files)
    assert outcome["status"] == "error"
    assert outcome["error_type"] == "adaptdl_core.collective.CollectiveError"
    assert "builtins.ConnectionRefusedError" in outcome["error_types"]
    assert isinstance(outcome["failed_at"], float)
    assert "peer gone" in outcome["traceback"]


def test_a_new_replica_worker_has_imported_torch_before_any_call():
    """Ray unpickles run()'s arguments in another thread of the worker actor; a torch
    import still running in a background thread then broke the unpickling ("partially
    initialized module 'torch.utils'") and the replica failed before its function began.
    So a new worker imports torch before it answers anything, in its own thread."""
    import subprocess
    import sys

    from tests.ray.conftest import REPO_ROOT
    code = ("import sys, threading\n"
            "from adaptdl_ray.replicas.worker import ReplicaWorker\n"
            "assert 'torch' not in sys.modules\n"
            "ReplicaWorker(0, {})\n"
            "print(sorted(t.name for t in threading.enumerate()), "
            "'adaptdl_core.torch' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True,
                         text=True, timeout=120, check=True).stdout.strip()
    assert out == "['MainThread'] True", out
