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
    leaves = ([g, g, e, g, e], np.array([0, 0, 1, 2, 2]), np.ones(5), np.zeros(5, dtype=int))
    nodes = carried_nodes(leaves, gpu)
    assert nodes == {0: "amd fp32 matrix-core"}
    assert carried_ms(nodes, [2.0, 3.0, 5.0]) == {"amd fp32 matrix-core": 2.0}


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
