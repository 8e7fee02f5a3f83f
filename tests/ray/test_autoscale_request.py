"""adaptdl_ray.autoscale.ResourceRequester: the standing request_resources call follows the
desired cluster size (replaced on change, withdrawn when nothing more is wanted), and Ray's
autoscaler SDK on a local Ray accepts and records it."""

from __future__ import annotations

import json

import pytest

from adaptdl_ray.autoscale import ResourceRequester

NODE = {"CPU": 8, "GPU": 1}


class Recorder:
    """Stands in for ray.autoscaler.sdk.request_resources."""

    def __init__(self, fail: bool = False):
        self.calls = []
        self.fail = fail

    def __call__(self, **kwargs):
        if self.fail:
            raise RuntimeError("Ray is not initialized yet")
        self.calls.append(kwargs)


def test_request_replace_and_withdraw():
    rec = Recorder()
    req = ResourceRequester(NODE, request_fn=rec)
    assert req.standing_nodes is None
    assert req.request(3) is True
    assert rec.calls == [{"bundles": [NODE, NODE, NODE]}]
    assert req.standing_nodes == 3
    assert req.request(3) is False           # unchanged: no call
    assert req.request(1) is True            # smaller: replaced, so Ray may scale down
    assert rec.calls[-1] == {"bundles": [NODE]}
    assert req.withdraw() is True
    assert rec.calls[-1] == {"bundles": []}
    assert req.standing_nodes == 0
    assert req.withdraw() is False
    assert len(rec.calls) == 3


def test_first_call_always_goes_out():
    # A request left by an earlier process may stand: the first withdraw must clear it.
    rec = Recorder()
    assert ResourceRequester(NODE, request_fn=rec).withdraw() is True
    assert rec.calls == [{"bundles": []}]


def test_bundles_are_copies():
    rec = Recorder()
    req = ResourceRequester(NODE, request_fn=rec)
    req.request(2)
    rec.calls[0]["bundles"][0]["CPU"] = 99
    assert req.node_template == NODE and req.bundles(1) == [NODE]


def test_baseline_nodes_are_not_pinned():
    rec = Recorder()
    req = ResourceRequester(NODE, baseline_nodes=2, request_fn=rec)
    assert req.request(2) is True and rec.calls[-1] == {"bundles": []}
    assert req.request(1) is False
    assert req.request(4) is True and rec.calls[-1] == {"bundles": [NODE] * 4}
    assert req.request(2) is True and rec.calls[-1] == {"bundles": []}


def test_failed_call_leaves_the_standing_size_and_retries():
    rec = Recorder(fail=True)
    req = ResourceRequester(NODE, request_fn=rec)
    with pytest.raises(RuntimeError, match="not initialized"):
        req.request(2)
    assert req.standing_nodes is None
    rec.fail = False
    assert req.request(2) is True and req.standing_nodes == 2


@pytest.mark.parametrize("kwargs, word", [
    (dict(node_template={}), "node_template"),
    (dict(node_template={"CPU": -1}), "node_template"),
    (dict(node_template={"CPU": 0}), "node_template"),
    (dict(node_template={"CPU": True}), "node_template"),
    (dict(node_template=NODE, baseline_nodes=-1), "baseline_nodes"),
    (dict(node_template=NODE, request_fn=3), "request_fn"),
])
def test_bad_arguments_are_named(kwargs, word):
    with pytest.raises(ValueError, match=word):
        ResourceRequester(**kwargs)


@pytest.mark.parametrize("bad", [-1, 1.5, True, "2"])
def test_bad_node_count_is_named(bad):
    with pytest.raises(ValueError, match="num_nodes"):
        ResourceRequester(NODE, request_fn=Recorder()).request(bad)


def _standing_request() -> list[dict]:
    """The bundles of the standing request, read where Ray's autoscaler reads them: the
    GCS's cluster constraints under autoscaler v2, the internal KV under v1 (Ray 2.60's
    internals, read by this test only: the library itself uses the public SDK call)."""
    from ray.autoscaler.v2.utils import is_autoscaler_v2

    if is_autoscaler_v2():
        from ray.autoscaler.v2.sdk import get_cluster_resource_state
        from ray.experimental.internal_kv import internal_kv_get_gcs_client

        state = get_cluster_resource_state(internal_kv_get_gcs_client())
        return [dict(r.request.resources_bundle)
                for c in state.cluster_resource_constraints
                for r in c.resource_requests for _ in range(r.count)]
    from ray.autoscaler._private.constants import AUTOSCALER_RESOURCE_REQUEST_CHANNEL
    from ray.experimental.internal_kv import _internal_kv_get

    return json.loads(_internal_kv_get(AUTOSCALER_RESOURCE_REQUEST_CHANNEL))


def test_local_ray_accepts_and_records_the_request(ray_session):
    """Under either autoscaler (run with RAY_enable_autoscaler_v2=1 for v2)."""
    assert ray_session.is_initialized()
    req = ResourceRequester({"CPU": 2})
    assert req.request(3) is True and _standing_request() == [{"CPU": 2}] * 3
    assert req.request(1) is True and _standing_request() == [{"CPU": 2}]
    assert req.withdraw() is True and _standing_request() == []
