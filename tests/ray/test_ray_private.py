"""The version check of the Ray internals adaptdl_ray uses (adaptdl_ray.replicas._ray_private);
the seams themselves are exercised in test_trial_files_unit.py."""

from __future__ import annotations

import logging

import pytest

ray = pytest.importorskip("ray")
from adaptdl_ray.replicas import _ray_private  # noqa: E402


def test_the_installed_ray_passes_without_a_warning(caplog):
    with caplog.at_level(logging.WARNING, logger=_ray_private.__name__):
        _ray_private.check_ray()
    assert not caplog.records, caplog.text


@pytest.mark.parametrize("version", ["2.59.3", "2.61.0", "3.0.0", "nightly"])
def test_a_ray_outside_the_tested_range_is_warned_about(monkeypatch, caplog, version):
    monkeypatch.setattr(ray, "__version__", version)
    with caplog.at_level(logging.WARNING, logger=_ray_private.__name__):
        _ray_private.check_ray()
    assert f"this is Ray {version}" in caplog.text and "ray[tune]==2.60.*" in caplog.text


def test_a_ray_without_an_internal_we_use_is_refused_naming_it(monkeypatch):
    from ray.train._internal import session as train_session
    monkeypatch.delattr(train_session, "get_session")
    with pytest.raises(ImportError, match=r"\(get_session\); install a tested Ray"):
        _ray_private.check_ray()


def test_the_allocator_s_modules_do_not_import_ray_tune():
    """The cluster allocator's actor reads node state only: importing its modules, the
    seam included, must not pull in Ray Tune, Ray Train or pandas (about a second of CPU
    in every allocator start; benchmarks/many_trials.py counts such costs)."""
    import subprocess
    import sys
    code = ("import sys, adaptdl_ray.cluster.allocator, adaptdl_ray.cluster.client, "
            "adaptdl_ray.replicas.nodes, adaptdl_ray.replicas._ray_private; "
            "print(sorted(m for m in ('ray.tune', 'ray.train', 'pandas') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=120).stdout.strip().splitlines()[-1]
    assert out == "[]", out


def test_the_tune_internals_are_checked_once_a_tune_module_is_imported(monkeypatch):
    from ray.train._internal import session as train_session
    monkeypatch.setattr(_ray_private, "_TUNE_CHECKED", False)
    monkeypatch.delattr(train_session, "get_session")
    _ray_private.check_ray(tune=False)  # the node-state internals alone still pass
    with pytest.raises(ImportError, match=r"\(get_session\)"):
        _ray_private.check_tune()
