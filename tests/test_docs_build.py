"""The documentation site (docs/, see docs/README.md) builds without a warning: every page,
every link between pages and to their headings, the API reference generated from the
docstrings and every Python cross-reference in them and in the pages. And the same
configuration does fail a build on a link to a missing page or heading and on a reference
to a Python name that does not exist, in a page or in a docstring (a small probe project).

The full build takes about 15 s on 2 busy cores (most of it importing torch and Ray for the
API reference); the probe a few seconds.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("sphinx")
pytest.importorskip("myst_parser")

REPO = Path(__file__).resolve().parents[1]
DOCS = REPO / "docs"


def build(source: Path, out: Path, pythonpath: Path | None = None) -> subprocess.CompletedProcess:
    """``sphinx -W -n`` (warnings are errors, every reference checked) of ``source`` with
    docs/conf.py, into ``out``: the documented build command, run in a fresh environment."""
    env = dict(os.environ)
    if pythonpath is not None:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(pythonpath),
                                                        env.get("PYTHONPATH")) if p)
    return subprocess.run(
        [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-n", "-E", "-q", "-b", "html",
         "-c", str(DOCS), str(source), str(out)],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=600)


def test_the_docs_build_without_a_warning(tmp_path):
    result = build(DOCS, tmp_path / "html")
    assert result.returncode == 0, result.stdout + result.stderr
    # The generated parts have their content: the API reference from the docstrings, the
    # CLI reference from the program's parser, the pages included from other folders.
    api = (tmp_path / "html" / "api" / "core.html").read_text()
    assert 'id="adaptdl_core.torch.AdaptiveDataLoader.autoscale_batch_size"' in api
    ray_api = (tmp_path / "html" / "api" / "ray.html").read_text()
    assert 'id="adaptdl_ray.tune.AdaptDLScheduler"' in ray_api  # a lazily exported name
    cli = (tmp_path / "html" / "cli_reference.html").read_text()
    assert "usage: adaptdl-ray submit" in cli and "--max-replicas" in cli
    assert "step_overhead.py" in (tmp_path / "html" / "benchmarks.html").read_text()


def test_a_broken_link_or_reference_fails_the_build(tmp_path):
    source = tmp_path / "src"
    source.mkdir()
    (source / "probe_module.py").write_text(
        '"""A module whose docstring names a function that does not exist."""\n\n\n'
        'def documented():\n    """Calls :func:`no_such_helper` and :func:`documented`."""\n')
    (source / "index.md").write_text(
        "# Probe\n\n[a page that is not there](missing_page.md),\n"
        "[a heading that is not there](#no-such-heading),\n"
        "{py:func}`adaptdl_core.torch.no_such_function`,\n"
        "{py:class}`adaptdl_core.torch.AdaptiveDataLoader` (exists: no error).\n\n"
        "```{eval-rst}\n.. automodule:: probe_module\n```\n")
    result = build(source, tmp_path / "html", pythonpath=source)
    errors = result.stderr
    assert result.returncode != 0, result.stdout + errors
    assert "missing_page.md" in errors, errors
    assert "no-such-heading" in errors, errors
    assert "no_such_function" in errors, errors
    assert "no_such_helper" in errors, errors  # a broken reference in a docstring
    assert "AdaptiveDataLoader" not in errors and "documented`" not in errors, errors


def test_the_readmes_link_to_files_that_exist():
    """README.md and docs/README.md are read on GitHub, outside the site: their relative
    links must name files of the repository."""
    for readme in (REPO / "README.md", DOCS / "README.md"):
        targets = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", readme.read_text())
        local = [t for t in targets if "://" not in t]
        assert local, readme
        missing = [t for t in local if not (readme.parent / t).exists()]
        assert not missing, f"{readme.name} links to missing files: {missing}"
