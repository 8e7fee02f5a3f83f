"""ElasticLoop: a custom iterable made elastic with the loader's own loop helper (one
process; a restart is simulated with context.reset())."""

import pytest

import adaptdl_core.torch as adl
from adaptdl_core import context
from adaptdl_core.torch.elastic_loop import ElasticLoop


def run(stop_after=None, seekable=False):
    """Two epochs over 5 items each; ask to stop after ``stop_after`` items in total.
    Returns the (epoch, item) pairs trained on, and whether the run was interrupted."""
    stream = ElasticLoop("stream")
    seen = []
    try:
        for epoch in adl.remaining_epochs_until(2):
            source = (lambda start: range(start, 5)) if seekable else range(5)
            for item in stream.iterate(source):
                seen.append((epoch, item))
                if len(seen) == stop_after:
                    adl.request_checkpoint_and_exit()
    except adl.CheckpointExit:
        return seen, True
    return seen, False


@pytest.mark.parametrize("seekable", [False, True])
def test_a_restarted_loop_resumes_at_its_item(ckpt_dir, seekable):
    first, interrupted = run(stop_after=7, seekable=seekable)
    assert interrupted and first[-1] == (1, 1)
    context.reset()  # the restart
    rest, interrupted = run(seekable=seekable)
    assert not interrupted
    # Every item of every epoch exactly once over the two runs.
    assert first + rest == [(e, i) for e in (0, 1) for i in range(5)]


def test_a_loop_finished_before_the_restart_is_skipped(ckpt_dir):
    stream = ElasticLoop()
    for epoch in adl.remaining_epochs_until(1):
        assert list(stream.iterate(range(3))) == [0, 1, 2]
        adl.request_checkpoint_and_exit()
        with pytest.raises(adl.CheckpointExit):
            list(ElasticLoop("second").iterate(range(3)))
    context.reset()
    stream = ElasticLoop()  # (same default name: adaptdl-loop-0)
    ElasticLoop("second")
    for epoch in adl.remaining_epochs_until(1):
        assert list(stream.iterate(range(3))) == []  # finished before the restart
        assert stream.position == 0


def test_loops_cannot_overlap():
    outer, inner = ElasticLoop("outer"), ElasticLoop("inner")
    with pytest.raises(RuntimeError, match="overlapping"):
        for _ in outer.iterate(range(2)):
            list(inner.iterate(range(2)))
