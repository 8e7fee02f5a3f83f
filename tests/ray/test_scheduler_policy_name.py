"""AdaptDLScheduler's ``policy`` given by name: no Ray cluster needed."""

from __future__ import annotations

import pytest

pytest.importorskip("ray.tune")

from adaptdl_core.policy import NodeInfo, PolluxPolicy, RemainingWorkPolicy  # noqa: E402
from adaptdl_ray.tune import AdaptDLScheduler  # noqa: E402


def nodes():
    return {"n0": NodeInfo({"CPU": 4})}


def test_policy_by_name():
    assert isinstance(AdaptDLScheduler(nodes_fn=nodes, policy="adaptdl").core.policy,
                      RemainingWorkPolicy)
    pollux = AdaptDLScheduler(nodes_fn=nodes, policy="pollux", p=-2.0).core.policy
    assert isinstance(pollux, PolluxPolicy) and pollux.p == -2.0 and pollux.fair_share
    with pytest.raises(ValueError, match="pollux, adaptdl"):
        AdaptDLScheduler(nodes_fn=nodes, policy="srtf")
    with pytest.raises(TypeError, match="policy"):
        AdaptDLScheduler(nodes_fn=nodes, policy=42)
