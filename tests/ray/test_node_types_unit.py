"""A node's accelerator type as the allocation sees it, read from fake ``ray.nodes()``
entries (no Ray started)."""

from __future__ import annotations

from adaptdl_ray.replicas.nodes import asked_by_label, cluster_nodes, node_accelerator_type


def entry(node_id, resources, labels=None, alive=True):
    return {"NodeID": node_id, "Alive": alive, "Resources": resources,
            "Labels": labels or {}}


def test_type_from_the_resource_and_the_label():
    nodes = [entry("a", {"CPU": 8, "GPU": 4, "accelerator_type:T4": 1.0, "node:10.0.0.1": 1}),
             entry("b", {"CPU": 8, "GPU": 8, "accelerator_type:A100": 1.0},
                   labels={"ray.io/accelerator-type": "H100"}),
             entry("c", {"CPU": 4}),
             entry("d", {"CPU": 4, "GPU": 2, "accelerator_type:L4": 1.0,
                         "accelerator_type:T4": 1.0})]
    out = cluster_nodes(nodes, draining=[])
    assert out["a"].accelerator_type == "T4"
    assert out["a"].resources == {"CPU": 8.0, "GPU": 4.0}
    assert out["b"].accelerator_type == "H100"       # the label overrides the resource
    assert out["c"].accelerator_type is None
    assert out["d"].accelerator_type is None         # two types: unknown
    assert node_accelerator_type(entry("e", {"accelerator_type:T4": 0.0})) is None


def test_a_type_is_asked_for_by_its_label_only_where_no_node_of_it_has_the_resource():
    label = "ray.io/accelerator-type"
    nodes = [entry("a", {"CPU": 8, "accelerator_type:T4": 1.0}),
             entry("b", {"CPU": 8, "accelerator_type:A10G": 1.0}, labels={label: "H100"}),
             entry("c", {"CPU": 8}, labels={label: "L4"}),
             entry("d", {"CPU": 8, "accelerator_type:L4": 1.0}),
             entry("e", {"CPU": 8}, labels={label: "V100"}),
             entry("f", {"CPU": 8, "accelerator_type:V100": 1.0}, alive=False)]
    assert not asked_by_label("T4", nodes)       # its resource
    assert asked_by_label("H100", nodes)         # a label overriding the detected type
    assert not asked_by_label("A10G", nodes)     # (no node is of that type any more)
    assert not asked_by_label("L4", nodes)       # one node of it carries the resource
    assert asked_by_label("V100", nodes)         # (the dead node does not count)
    assert not asked_by_label(None, nodes)
    assert not asked_by_label("H100")            # (no Ray to ask: by the resource)


def test_a_type_request_is_a_bundle_and_the_placement_groups_selectors():
    from adaptdl_ray.replicas.nodes import type_request
    assert type_request({"CPU": 1}, "T4", 2, by_label=False) == \
        ({"CPU": 1.0, "accelerator_type:T4": 0.001}, {})
    assert type_request({"CPU": 1}, "H100", 2, by_label=True) == \
        ({"CPU": 1.0}, {"bundle_label_selector": [{"ray.io/accelerator-type": "H100"}] * 2})
    assert type_request({"CPU": 1}, None, 3, by_label=True) == ({"CPU": 1.0}, {})
    assert type_request({"CPU": 1}, "H100", 1) == \
        ({"CPU": 1.0, "accelerator_type:H100": 0.001}, {})   # (no Ray to ask: by resource)
