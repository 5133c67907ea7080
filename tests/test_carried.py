"""kit predict says how much of a step's kernel time takes a kernel-time curve carried from where
it was measured (kit.workload.carried): the total's band widened, but nothing said which part of
the step rested on a curve nobody timed on that GPU or in that dtype."""
import numpy as np
import pytest

from kit.api import predict_model
from kit.hardware import get_gpu
from kit.ops import Attention, Elementwise, Gemm
from kit.workload.carried import carried_ms, carried_nodes, curve_tag


@pytest.fixture(scope="module")
def mi300x():
    return predict_model("gpt2", "mi300x", mode="inference", batch=4, seq=1024, dtype="bf16")


def test_the_tags():
    g = Gemm(m=4096, n=4096, k=4096, dtype="bf16")
    assert curve_tag(g, get_gpu("h200")) is None  # measured there
    assert curve_tag(g, get_gpu("a100-pcie-80gb")) == "h200 bf16"
    assert curve_tag(g, get_gpu("mi300x")) == "amd fp32 matrix-core"
    assert curve_tag(Gemm(m=4096, n=4096, k=4096), get_gpu("a100-pcie-80gb")) is None  # fp32: the tile-MLP
    assert curve_tag(Gemm(m=1, n=4096, k=4096, dtype="bf16"), get_gpu("mi300x")) is None  # a GEMV
    assert curve_tag(Elementwise("add", 1 << 20, "bf16"), get_gpu("mi300x")) is None
    att = Attention(b=4, heads=12, seq_q=1024, seq_kv=1024, head_dim=64, dtype="bf16", causal=True)
    assert curve_tag(att, get_gpu("a100-pcie-80gb")) == "h200 bf16 attention"
    from dataclasses import replace

    assert curve_tag(replace(att, seq_q=1), get_gpu("a100-pcie-80gb")) is None  # a decode step's roofline


def test_a_node_counts_only_where_every_leaf_takes_the_same_curve():
    gpu = get_gpu("mi300x")
    g = Gemm(m=4096, n=4096, k=4096, dtype="bf16")
    e = Elementwise("add", 1 << 20, "bf16")
    # node 0: two GEMMs; node 1: an add; node 2: a GEMM and an add; node 3: a GEMM (option 0) or
    # an add (option 1), as a convolution's implicit GEMM or Winograd
    leaves = ([g, g, e, g, e, g, e], np.array([0, 0, 1, 2, 2, 3, 3]), np.ones(7),
              np.array([0, 0, 0, 0, 0, 0, 1]))
    ways = carried_nodes(leaves, gpu)
    assert ways == {(0, 0): ("amd fp32 matrix-core", 1.0), (3, 0): ("amd fp32 matrix-core", 1.0)}
    lat = [2.0, 3.0, 5.0, 7.0]
    assert carried_ms(ways, lat, [0, 0, 0, 0]) == {"amd fp32 matrix-core": 9.0}
    assert carried_ms(ways, lat, [0, 0, 0, 1]) == {"amd fp32 matrix-core": 2.0}  # node 3 took its add


def test_a_step_sums_its_carried_kernels(mi300x):
    carried = mi300x.meta["carried_ms"]
    assert set(carried) <= {"amd fp32 matrix-core", "h200 bf16 attention"}
    t = mi300x.timeline
    gemm_ms = float(t.loc[t.op_class == "gemm", "latency_ms"].sum())
    # every aligned bf16 GEMM of gpt2 on an MI300X takes AMD's curve (any alignment there); its
    # GEMVs none (gpt2 at batch 4 has none), so the curve's time is the GEMM class's
    assert carried["amd fp32 matrix-core"] == pytest.approx(gemm_ms, rel=1e-9)
    assert 0 < sum(carried.values()) <= mi300x.kernel_ms * (1 + 1e-12)
    assert mi300x.to_dict()["carried_ms"] == carried


def test_measured_and_fp32_steps_carry_nothing():
    for gpu, dtype in (("h200", "bf16"), ("a100-pcie-80gb", "fp32")):
        r = predict_model("gpt2", gpu, mode="inference", batch=4, seq=1024, dtype=dtype)
        assert r.meta["carried_ms"] == {}
    wave = predict_model("gpt2", "mi300x", mode="inference", batch=4, seq=1024, dtype="bf16", predictor="wave")
    assert "carried_ms" not in wave.meta  # the curves are the tile predictor's


def test_kit_predict_prints_the_share(capsys):
    from kit.cli import main

    assert main(["predict", "gpt2", "--gpu", "mi300x", "--mode", "inference", "--batch", "4",
                 "--seq", "1024", "--dtype", "bf16"]) == 0
    line = [x for x in capsys.readouterr().out.splitlines() if x.strip().startswith("carried")]
    assert len(line) == 1 and "the amd fp32 matrix-core curve" in line[0]
    assert main(["predict", "gpt2", "--gpu", "h200", "--mode", "inference", "--batch", "4",
                 "--seq", "1024", "--dtype", "bf16"]) == 0
    assert not [x for x in capsys.readouterr().out.splitlines() if x.strip().startswith("carried")]


def test_kit_compare_gives_each_gpu_its_carried_share(capsys):
    from kit.cli import main
    from kit.cli.cmd_compare import compare

    r = compare("gpt2", ["h100-sxm", "mi300x", "v100-pcie-32gb"], mode="inference", batch=4, seq=1024,
                dtype="bf16")
    rows = {row["gpu"]: row for row in r["rows"]}
    assert rows["h100-sxm"]["carried_share"] == 0.0  # the curves were measured on Hopper
    mi = predict_model("gpt2", "mi300x", mode="inference", batch=4, seq=1024, dtype="bf16")
    assert rows["mi300x"]["carried_share"] == pytest.approx(sum(mi.meta["carried_ms"].values()) / mi.kernel_ms)
    assert rows["v100-pcie-32gb"]["carried_share"] is None  # no bf16 on a V100: no time at all
    assert main(["compare", "gpt2", "--gpus", "h100-sxm,mi300x", "--mode", "inference", "--batch", "4",
                 "--seq", "1024", "--dtype", "bf16"]) == 0
    out = capsys.readouterr().out
    assert "carried" in out.splitlines()[1] and f"{100 * rows['mi300x']['carried_share']:.0f}%" in out
    assert main(["compare", "gpt2", "--gpus", "h100-sxm,t4", "--mode", "inference", "--batch", "4",
                 "--seq", "1024"]) == 0  # fp32: no curve carried anywhere, no column
    assert "carried" not in capsys.readouterr().out


def test_a_convolution_counts_where_the_way_it_runs_is_on_a_carried_curve():
    """Found by review: a conv node (implicit GEMM or Winograd, whose transforms are elementwise)
    had counted only where every option was on the curve, so none did: vgg16 in bf16 on an
    A100-80GB read 3% carried where its implicit GEMMs alone were a third of the time."""
    from kit.workload import iteration as iteration_mod
    from kit.workload.kernel_times import predict_latencies

    from kit.workload.kernels import leaf_options
    from kit.workload.models import graph_of

    gpu = get_gpu("a100-pcie-80gb")
    r = predict_model("vgg16", gpu, mode="inference", batch=32, dtype="bf16")
    carried = r.meta["carried_ms"].get("h200 bf16", 0.0)
    nodes = iteration_mod._prepared(graph_of("vgg16", 32, None, "inference", "bf16"), "eager")["kernels"].nodes
    lat, _, _, _, _, taken = predict_latencies(nodes, gpu, "tile", with_option=True)
    assert (lat == r.timeline.latency_ms.to_numpy()).all()
    on_curve = sum(lat[i] for i, n in enumerate(nodes)
                   if all(curve_tag(op, gpu) == "h200 bf16" for op, _ in leaf_options(n.op)[taken[i]]))
    assert carried == pytest.approx(on_curve, rel=1e-9)
    assert carried > 0.25 * r.kernel_ms


def test_an_op_type_the_predictor_could_not_cost_is_not_counted():
    """Found by review: a GEMM the tile predictor failed on (the wave model priced it) had still
    counted as on the carried curve."""
    gpu = get_gpu("a100-pcie-80gb")
    g = Gemm(m=4096, n=4096, k=4096, dtype="bf16")
    leaves = ([g], np.array([0]), np.ones(1), np.zeros(1, dtype=int))
    assert carried_nodes(leaves, gpu) == {(0, 0): ("h200 bf16", 1.0)}
    assert carried_nodes(leaves, gpu, {"Gemm": "tile failed; used wave"}) == {}


def test_an_attention_of_few_queries_counts_the_curves_share_of_its_time():
    """Found by review of the carried share: an attention of 2-127 queries takes a log-linear
    blend of its roofline and the curve, and had counted as wholly on the curve."""
    from kit.workload.carried import curve_weight

    gpu = get_gpu("a100-pcie-80gb")
    att = [Attention(b=4, heads=32, seq_q=q, seq_kv=2048, head_dim=128, dtype="bf16") for q in (16, 128, 4096)]
    assert [curve_weight(a) for a in att] == pytest.approx([4 / 7, 1.0, 1.0])
    leaves = (att, np.array([0, 1, 2]), np.ones(3), np.zeros(3, dtype=int))
    ways = carried_nodes(leaves, gpu)
    assert {k: v[0] for k, v in ways.items()} == {(i, 0): "h200 bf16 attention" for i in range(3)}
    assert carried_ms(ways, [7.0, 5.0, 3.0], [0, 0, 0]) == {"h200 bf16 attention": pytest.approx(4.0 + 5.0 + 3.0)}
    # a decode step's one query keeps its roofline: no curve, nothing counted
    one = Attention(b=4, heads=32, seq_q=1, seq_kv=2048, head_dim=128, dtype="bf16")
    assert carried_nodes(([one], np.array([0]), np.ones(1), np.zeros(1, dtype=int)), gpu) == {}
