"""get_system(a System, nodes=..., network=...): the caller's own System (a preset's
dataclasses.replace) keeps its GPU and fabric on more nodes; it had been swapped for the preset
its key names."""
import dataclasses

import pytest

from kit.errors import KitError
from kit.hardware import get_system


def test_an_own_system_keeps_its_gpu_and_fabric_on_more_nodes():
    h200_box = dataclasses.replace(get_system("dgx-h100"), gpu_key="h200")
    two = get_system(h200_box, nodes=2)
    assert (two.gpu_key, two.nodes, two.world_size) == ("h200", 2, 16)
    assert two.network == h200_box.network
    half = dataclasses.replace(h200_box.fabric, links_per_gpu=9)
    slim = dataclasses.replace(h200_box, fabric=half)
    assert get_system(slim, nodes=3).gpu_bw_gbs == slim.gpu_bw_gbs == 9 * half.link_bw_gbs
    back = get_system(get_system(slim, nodes=3), nodes=1)  # and back to one box: the same System
    assert back == slim


def test_an_own_system_takes_another_network_and_a_key_of_its_own():
    mine = dataclasses.replace(get_system("dgx-a100"), key="my-box", name="My box", gpu_key="a100-sxm4-80gb")
    out = get_system(mine, nodes=2, network="roce-200g")
    assert (out.gpu_key, out.nodes, out.network.key) == ("a100-sxm4-80gb", 2, "roce-200g")
    assert out.key != mine.key and out.name.startswith("My box")
    with pytest.raises(KitError, match="network"):
        get_system(mine, nodes=2, network="none")
    with pytest.raises(KitError, match="nodes"):
        get_system(mine, nodes=0)


def test_a_preset_system_is_rescaled_as_its_name_is():
    for name, nodes, network in [("dgx-h100", 4, None), ("dgx-h100-x4", 2, None),
                                 ("dgx-a100", 2, "roce-200g")]:
        assert get_system(get_system(name), nodes=nodes, network=network) == get_system(
            name.removesuffix("-x4"), nodes=nodes, network=network)


R = dataclasses.replace
H100 = get_system("dgx-h100")


@pytest.mark.parametrize("bad, words", [
    (R(H100, gpus_per_node=0), "gpus_per_node"),
    (R(H100, gpus_per_node=8.5), "gpus_per_node"),
    (R(H100, fabric=R(H100.fabric, link_bw_gbs=0.0)), "link_bw_gbs"),
    (R(H100, fabric=R(H100.fabric, link_bw_gbs=float("nan"))), "link_bw_gbs"),
    (R(H100, fabric=R(H100.fabric, efficiency=0.0)), "efficiency"),
    (R(H100, fabric=R(H100.fabric, links_per_gpu=0)), "links_per_gpu"),
    (R(H100, fabric=R(H100.fabric, kind="nvswich")), "fabric kind"),
    (R(H100, fabric=R(H100.fabric, kind="nvlink-mesh", links=((0, 9, 1),))), "NVLink entry"),
    (R(H100, pcie=R(H100.pcie, gpus_per_switch=0)), "gpus_per_switch"),
    (R(get_system("dgx-h100", nodes=2), network=R(H100.network, nic_bw_gbs=0.0)), "nic_bw_gbs"),
])
def test_an_impossible_own_system_is_a_kit_error(bad, words):
    # each had been a ValueError, ZeroDivisionError or TypeError in the collective model, or a
    # silent answer (a NaN link: 1 GB all-reduced in 0.08 ms; "nvswich" priced as PCIe)
    from kit.comm import predict_collective

    with pytest.raises(KitError, match=words):
        get_system(bad)
    with pytest.raises(KitError, match=words):
        predict_collective("allreduce", 1e9, bad)


V100 = get_system("dgx1-v100")  # an NVLink mesh: its GPU count is a range() in the collective model


@pytest.mark.parametrize("bad, words", [
    (R(V100, gpus_per_node=8.0), "gpus_per_node"),  # == the preset: had been taken as the preset
    (R(H100, nodes=True), "nodes"),
    (R(H100, software=()), "software floor_us"),  # had been a KeyError in the model
    (R(H100, software=(("floor_us", "42"),)), "software"),
    (R(H100, key=None), "key"),
])
def test_a_system_equal_to_a_preset_but_for_a_type_is_checked(bad, words):
    # a value-keyed check: gpus_per_node 8.0 == 8, so dgx1-v100 with 8.0 GPUs a node passed as
    # the preset and was a TypeError ('float' object cannot be interpreted as an integer)
    from kit.comm import predict_collective

    with pytest.raises(KitError, match=words):
        get_system(bad)
    with pytest.raises(KitError, match=words):
        predict_collective("allreduce", 1e9, bad)


def test_a_system_that_passed_vouches_for_no_other():
    mine = R(V100, gpu_key="v100-sxm2-16gb")
    assert get_system(mine) is mine
    with pytest.raises(KitError, match="gpus_per_node"):  # == mine: had been taken as checked
        get_system(R(mine, gpus_per_node=8.0))
    for _ in range(20):  # nor does one gone whose id a new one takes
        good = R(mine, source="good")
        get_system(good)
        del good
        with pytest.raises(KitError, match="gpus_per_node"):
            get_system(R(mine, source="good", gpus_per_node=0))
