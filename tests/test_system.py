"""System presets: topology facts from the vendors' whitepapers, name forms, and errors."""
import pytest

from kit.errors import KitError
from kit.hardware import get_gpu, get_system, list_systems
from kit.hardware.system import network_keys

PRESETS = ["dgx1-v100", "a100x4-nvlink", "dgx-a100", "dgx-h100", "hgx-h200", "pcie8"]


def test_every_preset_is_listed_loads_and_cites_a_source():
    names = list_systems()
    for key in PRESETS:
        assert key in names
    for name in names:
        s = get_system(name)
        assert s.world_size == s.nodes * s.gpus_per_node
        assert get_gpu(s.gpu_key).key == s.gpu_key  # GPUs are catalog keys
        assert len(s.source) > 40 and len(s.network.source) > 5


def test_per_gpu_nvlink_bandwidth_matches_the_datasheets():
    # per direction: V100 6 x 25, A100 12 x 25, H100/H200 18 x 25 GB/s (NVIDIA whitepapers)
    assert get_system("dgx1-v100").gpu_bw_gbs == 150
    assert get_system("a100x4-nvlink").gpu_bw_gbs == 300
    assert get_system("dgx-a100").gpu_bw_gbs == 300
    assert get_system("dgx-h100").gpu_bw_gbs == 450
    assert get_system("hgx-h200").gpu_bw_gbs == 450


def test_nvlink_bandwidth_agrees_with_the_gpu_catalog():
    # the catalog gives NVLink per GPU in both directions together: twice the per-direction figure
    for key in ["dgx1-v100", "a100x4-nvlink", "dgx-a100", "dgx-h100", "hgx-h200"]:
        s = get_system(key)
        assert get_gpu(s.gpu_key).interconnect_bw_gbs == pytest.approx(2 * s.gpu_bw_gbs)


def test_dgx1_hybrid_cube_mesh():
    f = get_system("dgx1-v100").fabric
    assert f.kind == "nvlink-mesh"
    for g in range(8):  # every V100 uses all 6 of its NVLinks
        assert sum(n for a, b, n in f.links if g in (a, b)) == 6
    # two fully connected quads 0-3 and 4-7, joined GPU i <-> i+4
    for quad in ([0, 1, 2, 3], [4, 5, 6, 7]):
        assert all(f.pair_links(a, b) for a in quad for b in quad if a < b)
    assert all(f.pair_links(i, i + 4) for i in range(4))
    assert f.pair_links(0, 5) == 0 and f.pair_links(3, 4) == 0


def test_a100x4_is_a_full_mesh_of_four_links_per_pair():
    s = get_system("a100x4-nvlink")
    assert s.gpus_per_node == 4 and s.gpu_key == "a100-sxm4-40gb"
    assert all(s.fabric.pair_links(a, b) == 4 for a in range(4) for b in range(4) if a != b)


def test_nvls_only_on_third_generation_nvswitch():
    assert get_system("dgx-h100").fabric.nvls and get_system("hgx-h200").fabric.nvls
    assert not get_system("dgx-a100").fabric.nvls


def test_multi_node_forms():
    a = get_system("dgx-h100", nodes=4)
    assert a.nodes == 4 and a.world_size == 32 and a.network.key == "ib-ndr"
    b = get_system("dgx-h100-ib-ndr-x4")
    assert (b.nodes, b.network.key) == (4, "ib-ndr")
    c = get_system("DGX A100 RoCE 200G x2")  # case and punctuation do not matter
    assert (c.nodes, c.network.key, c.network.nic_bw_gbs) == (2, "roce-200g", 25.0)
    d = get_system("dgx-a100", nodes=2, network="ib-hdr")
    assert not d.network.sharp and d.nics_per_node == 8  # NCCL's CollNet is opt-in
    assert get_system("dgx-a100", nodes=2, network="ib-hdr-sharp").network.sharp
    assert get_system("vtrain-a100").key == "dgx-a100"
    assert set(network_keys()) >= {"ib-hdr", "ib-ndr", "roce-400g"}


def test_network_line_rates():
    # 200 Gb/s = 25 GB/s, 400 Gb/s = 50 GB/s
    assert get_system("dgx-a100", nodes=2).network.nic_bw_gbs == 25.0
    assert get_system("dgx-h100", nodes=2).network.nic_bw_gbs == 50.0


@pytest.mark.parametrize("call, words", [
    (lambda: get_system("dgx-h1000"), ["unknown system", "dgx-h100"]),
    (lambda: get_system("dgx-h100", nodes=0), ["nodes"]),
    (lambda: get_system("dgx-h100", nodes=2, network="myrinet"), ["unknown network", "ib-ndr"]),
    (lambda: get_system(""), ["non-empty"]),
])
def test_errors_name_the_problem(call, words):
    with pytest.raises(KitError) as e:
        call()
    for w in words:
        assert w in str(e.value)
