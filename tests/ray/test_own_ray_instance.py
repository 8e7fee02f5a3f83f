"""Every Ray instance the tests, benchmarks and examples start is their own.

``ray.init()`` without ``address="local"`` joins a cluster already running on the
machine (``ray start --head``), where ``num_cpus`` is refused and other users' work runs;
a Ray cluster the code starts itself (``ray.cluster_utils.Cluster``) is joined by its
``.address``. Checked on the source (no Ray started).
"""

from __future__ import annotations

import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[2]
SOURCES = sorted(p for d in ("tests", "benchmarks", "examples")
                 for p in (ROOT / d).rglob("*.py"))


def _is_ray_init(call: ast.Call) -> bool:
    func = call.func
    return (isinstance(func, ast.Attribute) and func.attr == "init"
            and isinstance(func.value, ast.Name) and func.value.id == "ray")


def _own_instance(call: ast.Call) -> bool:
    """``address="local"``, the ``.address`` of a cluster object the caller made, or the
    address Ray gives a Ray Job's entrypoint (``os.environ["RAY_ADDRESS"]``)."""
    for kw in call.keywords:
        if kw.arg == "address":
            value = kw.value
            return (isinstance(value, ast.Constant) and value.value == "local") or \
                (isinstance(value, ast.Attribute) and value.attr == "address") or \
                (isinstance(value, ast.Subscript) and isinstance(value.slice, ast.Constant)
                 and value.slice.value == "RAY_ADDRESS")
    return False


def ray_init_calls(source: str) -> list[tuple[int, bool]]:
    """``(line, starts or joins its own instance)`` for each ``ray.init(...)`` call."""
    return [(node.lineno, _own_instance(node)) for node in ast.walk(ast.parse(source))
            if isinstance(node, ast.Call) and _is_ray_init(node)]


def test_the_check_tells_own_instances_from_joined_ones():
    assert ray_init_calls('ray.init(address="local", num_cpus=2)') == [(1, True)]
    assert ray_init_calls("ray.init(address=cluster.address)") == [(1, True)]
    assert ray_init_calls("ray.init(num_cpus=2)") == [(1, False)]
    assert ray_init_calls('ray.init(address="auto")') == [(1, False)]
    assert ray_init_calls('ray.init(address=os.environ["RAY_ADDRESS"])') == [(1, True)]


def test_every_ray_init_starts_its_own_instance():
    joined = [f"{path.relative_to(ROOT)}:{line}" for path in SOURCES
              for line, own in ray_init_calls(path.read_text()) if not own]
    assert not joined, f"ray.init may join a running cluster at {joined}: pass address=\"local\""
    assert any(ray_init_calls(p.read_text()) for p in SOURCES)  # the scan found the calls
