"""One name per public type: the old Tune-side names still resolve, with a warning."""

from __future__ import annotations

import subprocess
import sys

import pytest

import adaptdl_ray.tune
from adaptdl_core.decision import CoreState, JobRecord, JobSpec
from adaptdl_ray.tune import scheduler_state

OLD_NAMES = [("ReplicaSpec", JobSpec), ("SchedulerState", CoreState), ("TrialRecord", JobRecord)]


@pytest.mark.parametrize("old, new", OLD_NAMES)
def test_an_old_name_on_the_package_is_the_same_class_with_a_warning(old, new):
    with pytest.warns(DeprecationWarning,
                      match=rf"adaptdl_ray\.tune\.{old} is deprecated: use "
                            rf"adaptdl_core\.decision\.{new.__name__}"):
        assert getattr(adaptdl_ray.tune, old) is new
    with pytest.warns(DeprecationWarning):  # every lookup warns (the old name is not cached)
        getattr(adaptdl_ray.tune, old)
    assert old not in adaptdl_ray.tune.__all__


@pytest.mark.parametrize("old, new", OLD_NAMES[1:])
def test_the_state_module_resolves_its_old_names_with_a_warning(old, new):
    with pytest.warns(DeprecationWarning, match=rf"scheduler_state\.{old} is deprecated"):
        assert getattr(scheduler_state, old) is new
    assert scheduler_state.STATE_FILE == CoreState.FILE


def test_unknown_names_are_still_attribute_errors():
    with pytest.raises(AttributeError, match="'adaptdl_ray.tune' has no attribute 'Nope'"):
        adaptdl_ray.tune.Nope  # noqa: B018
    with pytest.raises(AttributeError, match="has no attribute 'Nope'"):
        scheduler_state.Nope  # noqa: B018


def test_the_library_itself_uses_no_old_name():
    """Importing the Tune front-end (scheduler, trainable, run_job) warns about no old
    name: it uses the one names itself (a fresh process, so every import runs)."""
    code = ("import warnings\n"
            "warnings.simplefilter('always')\n"
            "with warnings.catch_warnings(record=True) as seen:\n"
            "    import adaptdl_ray.job, adaptdl_ray.tune.scheduler, adaptdl_ray.tune.trainable\n"
            "print([str(w.message) for w in seen if 'is deprecated: use adaptdl_core' "
            "in str(w.message)])\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, check=True).stdout
    assert out.strip().splitlines()[-1] == "[]", out
