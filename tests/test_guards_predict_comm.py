"""Guards on rules of the tile predictor, the tile choice, the iteration timeline, compiled fusion
and the collective model that no other test pinned down: each expectation is rebuilt here from
the rule's own formula (written out in the test), from an invariant, or from a second public
function, never copied from a printed prediction."""
from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest

from kit.api import predict_op
from kit.comm import predict_collective
from kit.comm.algorithms import plans
from kit.comm.topology import group_ring_gbs, node_net_gbs, nvls_gbs, resolve_group
from kit.hardware import get_gpu, get_system
from kit.ops import Attention, Elementwise, Gemm, LayerNorm, Softmax
from kit.predict import get_predictor
from kit.predict.element_rates import element_bound_ms
from kit.predict.features import arrays_from_ops, waves
from kit.predict.gemv import PARAMS as GEMV_PARAMS
from kit.predict.roofline import roofline
from kit.predict.tensor_core import SHORT_MS, attention_params_for, kernel_ms_of, params_for
from kit.predict.small_op_bounds import one_wave_twin
from kit.predict.tile_mlp import TilePredictor
from kit.tiling import TILE_SLACK, gemm_tiling, gemm_tilings
from kit.workload.fusion import apply_fusion
from kit.workload.graph import Node, OpGraph
from kit.workload.iteration import CpuOverhead, isolation_floor_ms, iteration

N = 1 << 20  # elements of the hand-built graphs' tensors


@pytest.fixture(scope="module")
def tile():
    return get_predictor("tile")


# -- kit.tiling ---------------------------------------------------------------------------------
@pytest.mark.parametrize("gpu", ["a100-pcie-40gb", "h100-sxm", "t4"])
def test_equal_area_tiles_tie_break_on_the_faster_wave_model(gpu):
    """gemm_tiling picks the largest tile within TILE_SLACK of the best wave-model time; among
    tiles of that same area it must take the one the wave model says is fastest (fp32
    1824x2624x1024 on an A100: 32x64 at 0.511 ms, not 64x32 at 0.534 ms)."""
    shapes = [(1824, 2624, 1024), (2624, 1824, 1024), (1000, 3000, 512), (4096, 1536, 2048),
              (777, 4099, 256), (3000, 1000, 4096)]
    for m, n, k in shapes:
        g = Gemm(m=m, n=n, k=k)
        options = gemm_tilings(g, gpu)
        best = min(t.wave_model_ms for t in options)
        near = [t for t in options if t.wave_model_ms <= best * (1 + TILE_SLACK)]
        chosen = gemm_tiling(g, gpu)
        area = chosen.tile_dims[0] * chosen.tile_dims[1]
        assert area == max(t.tile_dims[0] * t.tile_dims[1] for t in near)
        same_area = [t.wave_model_ms for t in near if t.tile_dims[0] * t.tile_dims[1] == area]
        assert chosen.wave_model_ms == min(same_area), (gpu, (m, n, k), chosen.tile_dims)


# -- kit.predict.tile_mlp -----------------------------------------------------------------------
def _varied_ops(rng, half):
    ops = []
    for _ in range(60):  # GEMMs: fp32, bf16 aligned, bf16 unaligned, batched
        m, n, k = (int(v) for v in rng.integers(1, 6000, 3))
        ops.append(Gemm(m=m, n=n, k=k))
        ops.append(Gemm(m=m - m % 8 + 8, n=n - n % 8 + 8, k=k - k % 8 + 8, dtype=half))
        ops.append(Gemm(m=m | 1, n=n | 1, k=k | 1, dtype=half, align=1))
    for s in (256, 1024, 4096):
        ops += [Gemm(m=s, n=s, k=s), Gemm(m=s, n=s, k=s, dtype=half), Gemm(m=s, n=s, k=s, b=8)]
    for numel in np.unique(np.logspace(0, 8.5, 25).astype(int)):
        for kind in ("add", "gelu", "relu", "mul", "exp"):
            ops.append(Elementwise(kind, int(numel), "fp32" if numel % 2 else half))
    for rows in (1, 8, 300, 4096, 65536):
        for cols in (32, 768, 4096, 50257):
            ops += [Softmax(rows, cols), LayerNorm(rows, cols), replace(Softmax(rows, cols), dtype=half)]
    return ops


@pytest.mark.parametrize("gpu", ["a100-pcie-40gb", "h100-sxm", "t4", "mi210"])
def test_band_is_ordered_and_p10_never_under_the_roofline(tile, gpu):
    """Over a few hundred varied ops, the tile predictor's p10 is never under the op's roofline
    (no kernel beats the peak or the bandwidth; p10 is floored at the wave bound, which is at
    least the roofline) and p10 <= latency <= p90."""
    half = "bf16" if "bf16" in get_gpu(gpu).dtypes else "fp16"
    ops = _varied_ops(np.random.default_rng(7), half)
    assert len(ops) > 300
    pred = tile.predict(ops, gpu)
    p10, lat, p90 = (pred[c].to_numpy(float) for c in ("latency_p10_ms", "latency_ms", "latency_p90_ms"))
    roof = pred.roofline_ms.to_numpy(float)
    bad = np.flatnonzero(p10 < roof - 1e-12)
    assert not bad.size, [(ops[i], p10[i], roof[i]) for i in bad[:3]]
    assert (p10 <= lat * (1 + 1e-12)).all() and (lat <= p90 * (1 + 1e-12)).all()


def test_element_bound_adds_only_the_floor_a_prediction_carries(tile, monkeypatch):
    """_element_bound's rule (its docstring): a rated kind (gelu, pow) or a softmax row is no
    faster than its elements at the measured rate. Over the dispatch floor a prediction becomes
    at least the bound plus the floor; under it, it carries at least its roofline's work and
    grows by what the bound exceeds that by, unless the bound exceeds the roofline plus a
    kernel's start (the least the stream gives a kernel), where it too becomes the bound plus
    the floor, so that the stream keeps the bound:
        latency = max(lat, floor + bound) if lat >= floor or bound > roofline + start
                  else lat + max(0, bound - roofline),
    a lifted op's p10 by the floor's rule on its own value and to at least the bound plus the
    floor it carries, never over the latency. The bound is rebuilt from element_rates and the isolation
    floor; the values before the bound are read as the method is called."""
    from kit.predict.element_rates import softmax_bound_ms

    gpu = get_gpu("h200")
    floor = isolation_floor_ms(tile, gpu)
    seen = []
    original = TilePredictor._element_bound

    def spy(self, cls, a, g, roofline_ms, lat, p10, p90):
        before, p10_before = lat.copy(), p10.copy()
        original(self, cls, a, g, roofline_ms, lat, p10, p90)
        bound = (softmax_bound_ms(a["rows"], a["cols"], g) if cls == "softmax"
                 else element_bound_ms(a["kind"], a["numel"], g))
        seen.append((bound, np.asarray(roofline_ms, float).copy(), before, p10_before, lat.copy(), p10.copy()))

    monkeypatch.setattr(TilePredictor, "_element_bound", spy)
    ops = [Elementwise("gelu", 100_000, "bf16"), Elementwise("gelu", 100_000, "fp32"),
           Elementwise("gelu", 30_000_000, "bf16"), Elementwise("pow", 50_000, "bf16"),
           Softmax(1, 300, "bf16"), Softmax(1 << 17, 2048, "bf16"), Softmax(64, 1024, "bf16")]
    tile.predict(ops, gpu)

    from kit.workload.kernel_times import KERNEL_MIN_US, in_stream_ms

    def rule(t, bound, roof, stream=True):
        over = (t >= floor) | ((bound > roof + KERNEL_MIN_US / 1e3) if stream else False)
        return np.where(over, np.maximum(t, floor + bound), t + np.maximum(0.0, bound - roof))

    checked = lifted = under = binds = 0
    for bound, roof, before, p10_before, after, p10 in seen:
        np.testing.assert_allclose(after, rule(before, bound, roof), rtol=1e-12)
        # in the stream the bound holds (the op's last step before the one-wave cap)
        assert (in_stream_ms(after, roof, floor) >= bound * (1 - 1e-9)).all()
        binds += int(((before < floor) & (bound > roof + KERNEL_MIN_US / 1e3)).sum())
        up = after > before
        want = np.where(up, np.minimum(after, np.maximum(rule(p10_before, bound, roof, stream=False),
                                                         bound + np.minimum(p10_before, floor))), p10_before)
        np.testing.assert_allclose(p10, want, rtol=1e-12)
        assert (p10 <= after * (1 + 1e-12)).all()
        checked += int((bound > 0).sum())
        lifted += int((after > before).sum())
        under += int(((bound > 0) & (before < floor)).sum())
    assert checked and lifted and under and binds  # bound, lift, under the floor, and binding there


def test_an_op_under_the_floor_whose_bytes_bind_first_is_not_lifted(tile, monkeypatch):
    """An op predicted under the floor had the whole element bound added, and its p10 set to its
    latency, even where its roofline (its bytes) exceeds the bound: an L4 fp32 softmax of
    1,024 x 300 (bound 1 us, roofline 8 us) rose 33.0 -> 34.0 us, a one-row bf16 softmax of
    257 on an H200 had its band's p10 jump 61% to the latency."""
    from kit.predict.element_rates import softmax_bound_ms

    import kit.predict.small_op_bounds as sob

    l4, h200 = get_gpu("l4"), get_gpu("h200")
    # the element bound's rule alone: one row's latency (softmax_row_ms) lifts every softmax
    # to it plus the floor, whatever its bytes
    monkeypatch.setattr(sob, "softmax_row_ms", lambda cols, gpu, dtype: np.zeros(len(cols)))
    # 512 x 300: with the weights since the power share, 1,024 x 300 comes out over the floor
    ops = [Softmax(512, 300, "fp32")]
    row = tile.predict(ops, l4).iloc[0]
    assert 0 < softmax_bound_ms([512], [300], l4)[0] < row.roofline_ms  # bound, but bytes bind first
    assert row.latency_ms < isolation_floor_ms(tile, l4)  # under the floor: the case in question
    a, b = tile.predict([Softmax(1, 256, "bf16"), Softmax(1, 257, "bf16")], h200).itertuples()
    monkeypatch.setattr(sob, "softmax_bound_ms", lambda rows, cols, gpu: np.zeros(len(rows)))
    unbound = tile.predict(ops, l4).iloc[0]
    assert row.latency_ms == unbound.latency_ms and row.latency_p10_ms == unbound.latency_p10_ms
    assert b.latency_p10_ms < 0.8 * b.latency_ms and b.latency_p10_ms < 1.05 * a.latency_p10_ms


@pytest.mark.parametrize("gpu", ["a100-pcie-40gb", "h100-sxm", "t4", "mi210", "v100-sxm2-32gb"])
def test_a_vector_op_just_under_one_wave_is_not_slower_than_a_full_wave(tile, gpu):
    """Every block of a one-wave kernel runs at once, so an elementwise, softmax or layer norm
    op with half to all of a wave's blocks is never slower than the same op grown to exactly
    one full wave (kit.predict.small_op_bounds.one_wave_twin). Kinds with an element rate (gelu, pow)
    too: their element bound had been added after the cap, on the op's own uncapped latency,
    which left a bf16 gelu at 0.9 of a wave on a V100 a hair over the full wave."""
    g = get_gpu(gpu)
    shares = (0.51, 0.7, 0.9, 0.99)
    for kind in ("add", "mul", "relu", "tanh", "exp", "copy", "sigmoid", "silu", "gelu", "pow"):
        for dtype in ("fp32", "bf16"):
            op = Elementwise(kind, 1000, dtype)
            slots = int(waves("elementwise", arrays_from_ops("elementwise", [op]), g, dtype)["slots"][0])
            per_tile = one_wave_twin("elementwise", op, 1).numel
            ops = [replace(op, numel=int(s * slots) * per_tile) for s in shares]
            ops.append(one_wave_twin("elementwise", op, slots))
            lat = tile.predict(ops, g).latency_ms.to_numpy(float)
            assert (lat[:-1] <= lat[-1] * (1 + 1e-6)).all(), (gpu, kind, dtype, lat)
    for cls, make in (("softmax", Softmax), ("layernorm", LayerNorm)):
        for cols in (64, 768, 4096):
            op = make(8, cols)
            slots = int(waves(cls, arrays_from_ops(cls, [op]), g)["slots"][0])
            per_tile = one_wave_twin(cls, op, 1).rows
            ops = [replace(op, rows=int(s * slots) * per_tile) for s in shares]
            ops.append(one_wave_twin(cls, op, slots))
            lat = tile.predict(ops, g).latency_ms.to_numpy(float)
            assert (lat[:-1] <= lat[-1] * (1 + 1e-6)).all(), (gpu, cls, cols, lat)


def test_causal_attention_cap_keeps_the_small_head_factor(tile):
    """A causal mask only removes work: a causal attention is capped at the same attention
    unmasked, priced with the same small-head factor (head size under 128). With 4,096 queries
    over 128 keys the top-left mask keeps 99% of the pairs (128 x 129 / 2 + 3,968 x 128 of
    4,096 x 128; equal rooflines where memory-bound), so the causal prediction is the unmasked
    one; in closed form, from 128 queries on (no roofline blend):
        causal = min(curve(r_causal, causal, small), curve(r_full, small)) + floor."""
    gpu = get_gpu("a100-pcie-40gb")
    causal = Attention(b=4, heads=16, seq_q=4096, seq_kv=128, head_dim=64, dtype="bf16", causal=True)
    full = replace(causal, causal=False)
    pred = tile.predict([causal, full], gpu)
    lat_c, lat_f = pred.latency_ms.tolist()
    assert lat_c <= lat_f * (1 + 1e-12)
    params, floor = attention_params_for(gpu, "bf16"), isolation_floor_ms(tile, gpu)
    r_c, r_f = roofline(causal, gpu).time_ms, roofline(full, gpu).time_ms
    t_c = kernel_ms_of([r_c], params, [True], [True])
    t_f = kernel_ms_of([r_f], params, [False], [True])
    assert lat_f == pytest.approx(t_f[0][0] + floor, rel=1e-9)
    assert lat_c == pytest.approx(min(t_c[0][0], t_f[0][0]) + floor, rel=1e-9)
    for col, j in (("latency_p10_ms", 1), ("latency_p90_ms", 2)):
        assert pred[col].iloc[0] == pytest.approx(min(t_c[j][0], t_f[j][0]) + floor, rel=1e-9)
    if r_c == pytest.approx(r_f, rel=1e-12):
        assert lat_c == pytest.approx(lat_f, rel=1e-9)


# -- kit.predict.tensor_core --------------------------------------------------------------------
@pytest.mark.parametrize("gpu", ["h100-sxm", "h200"])
def test_short_kernels_take_the_short_band(tile, gpu):
    """The tensor-core curve's band: a kernel the curve puts under SHORT_MS (20 us) takes
    band_log_short, a longer one band_log. The tile predictor adds its dispatch floor to all
    three quantiles, so log((p90 - floor) / (latency - floor)) is the band's upper edge and
    log((p10 - floor) / (latency - floor)) its lower one (unless p10 sits on the roofline)."""
    g = get_gpu(gpu)
    params = params_for(g, "bf16")
    floor = isolation_floor_ms(tile, g)
    seen = set()
    for s in (256, 512, 1024, 4096, 8192):
        pred = tile.predict([Gemm(m=s, n=s, k=s, dtype="bf16")], g).iloc[0]
        t = pred.latency_ms - floor
        short = t < SHORT_MS
        lo, hi = params["band_log_short"] if short else params["band_log"]
        seen.add(short)
        assert math.log((pred.latency_p90_ms - floor) / t) == pytest.approx(hi, abs=1e-9), s
        if t * math.exp(lo) > pred.roofline_ms:
            assert math.log((pred.latency_p10_ms - floor) / t) == pytest.approx(lo, abs=1e-9), s
    assert seen == {True, False}
    assert params["band_log_short"] != params["band_log"]


@pytest.mark.parametrize("gpu", ["a100-pcie-40gb", "h100-sxm"])
def test_attention_takes_the_whole_curve_from_128_queries(gpu):
    """Attention with ATTENTION_MIN_SEQ_Q = 128 queries or more takes the whole curve; only
    fewer are blended with the roofline, and predict_op's source says so only for those."""
    op = Attention(b=2, heads=16, seq_q=128, seq_kv=2048, head_dim=128, dtype="bf16")
    assert "blended" not in predict_op(op, gpu, "tile")["source"]
    assert "blended" not in predict_op(replace(op, seq_q=129), gpu, "tile")["source"]
    assert "blended" in predict_op(replace(op, seq_q=127), gpu, "tile")["source"]


# -- kit.predict.gemv ---------------------------------------------------------------------------
@pytest.mark.parametrize("gpu", ["a100-pcie-40gb", "h100-sxm", "t4", "mi210"])
def test_a_gemv_is_a_stream_of_its_bytes_plus_the_floor(tile, gpu):
    """kit.predict.gemv's rule (module doc): kernel_ms = (c0_us + bytes / (eff x BW) x 1e6) / 1e3,
    the band exp(band_log) x that; the tile predictor adds its dispatch floor. The bytes are the
    matrix, the vector and the output in fp32: 4 (m k + k n + m n)."""
    g = get_gpu(gpu)
    floor = isolation_floor_ms(tile, g)
    c0, eff, (lo, hi) = GEMV_PARAMS["c0_us"], GEMV_PARAMS["eff"], GEMV_PARAMS["band_log"]
    shapes = [(1, 8192, 8192), (8192, 1, 8192), (1, 4096, 11008), (1, 1, 10**7)]
    pred = tile.predict([Gemm(m=m, n=n, k=k) for m, n, k in shapes], g)
    for (m, n, k), (_, row) in zip(shapes, pred.iterrows()):
        nbytes = 4.0 * (m * k + k * n + m * n)
        kernel = (c0 + nbytes / (eff * g.mem_bw_gbs * 1e9) * 1e6) / 1e3
        assert row.tile == "gemv"
        assert row.latency_ms == pytest.approx(kernel + floor, rel=1e-9)
        assert row.latency_p90_ms == pytest.approx(kernel * math.exp(hi) + floor, rel=1e-9)
        assert row.latency_p10_ms == pytest.approx(max(kernel * math.exp(lo) + floor, row.roofline_ms), rel=1e-9)


# -- kit.workload.iteration / fusion ------------------------------------------------------------
def _views_graph(trailing_views: int = 0):
    """mm -> view -> view -> mul -> tanh -> mm, then `trailing_views` views of the last output."""
    g = Gemm(m=1024, n=1024, k=1024)
    nodes = [
        Node(0, "aten.mm.default", g, "gemm", "fwd", (), "h.0", 0, N * 4),
        Node(1, "aten.view.default", None, "free", "fwd", (0,), "h.0", 0, 0, kernels=0),
        Node(2, "aten.view.default", None, "free", "fwd", (1,), "h.0", 0, 0, kernels=0),
        Node(3, "aten.mul.Tensor", Elementwise("mul", N, inputs=1), "elementwise", "fwd", (2,), "h.0", 0, N * 4),
        Node(4, "aten.tanh.default", Elementwise("tanh", N), "elementwise", "fwd", (3,), "h.0", 0, N * 4),
        Node(5, "aten.mm.default", g, "gemm", "fwd", (4,), "h.0", 0, N * 4),
    ]
    for i in range(trailing_views):
        nodes.append(Node(6 + i, "aten.view.default", None, "free", "fwd", (5 + i,), "h.0", 0, 0, kernels=0))
    return OpGraph(tuple(nodes), "toy-views", {"mode": "inference"})


def test_cpu_issue_time_pays_each_free_op():
    """The CPU issues each kernel node after the free (view) ops before it: per kernel
    cpu_op_us + launch_us, plus free_op_us per view. Four kernels and two views:
    cpu_ms = (4 (cpu_op + launch) + 2 free_op) / 1e3."""
    oh = CpuOverhead(cpu_op_us=10.0, launch_us=5.0, free_op_us=3.0)
    it = iteration(_views_graph(), "a100-pcie-40gb", predictor="roofline", overhead=oh)
    assert it.cpu_ms == pytest.approx((4 * (10.0 + 5.0) + 2 * 3.0) / 1e3, rel=1e-12)
    # the kernel after the views is issued after them
    assert it.timeline["cpu_end_ms"].iloc[1] == pytest.approx((2 * 15.0 + 2 * 3.0) / 1e3, rel=1e-12)


def test_trailing_free_ops_still_take_cpu_time():
    """Free ops after the last kernel are still dispatched by the CPU: a CPU-bound graph ending
    in 3 views takes the issue of its 4 kernels plus 3 free ops (1 ms per op, 0.5 ms per view:
    4 + 5 x 0.5 = 6.5 ms), its GPU long idle."""
    oh = CpuOverhead(cpu_op_us=1000.0, launch_us=0.0, free_op_us=500.0)
    it = iteration(_views_graph(trailing_views=3), "a100-pcie-40gb", predictor="roofline", overhead=oh)
    assert float(it.timeline["gpu_end_ms"].iloc[-1]) < it.total_ms - 1.0  # the GPU long done
    assert it.total_ms == pytest.approx(4 * 1.0 + (2 + 3) * 0.5, rel=1e-12)
    assert it.total_ms >= it.cpu_ms + 3 * 0.5 - 1e-12


def test_a_fused_chain_ending_the_graph_writes_its_output():
    """Compiled fusion: a chain of memory-bound ops with no consumer after it (the model's
    output) still writes that output. mm -> mul -> tanh: the fused kernel reads the mm output
    once (4N bytes) and writes tanh's output once (4N): 8N."""
    e = Elementwise("mul", N, inputs=1)
    nodes = (
        Node(0, "aten.mm.default", Gemm(m=1024, n=1024, k=1024), "gemm", "fwd", (), "h.0", 0, N * 4),
        Node(1, "aten.mul.Tensor", e, "elementwise", "fwd", (0,), "h.0", 0, N * 4),
        Node(2, "aten.tanh.default", Elementwise("tanh", N), "elementwise", "fwd", (1,), "h.0", 0, N * 4),
    )
    comp = apply_fusion(OpGraph(nodes, "toy-tail", {"mode": "inference"}), "compiled")
    assert [n.op_class for n in comp] == ["gemm", "fused"]
    assert comp[1].op.bytes == pytest.approx(8 * N)
    assert comp[1].out_bytes == 4 * N


# -- kit.comm -----------------------------------------------------------------------------------
@pytest.mark.parametrize("preset,nodes", [("dgx-a100", 3), ("dgx-a100", 5), ("dgx-h100", 3),
                                          ("pcie8", 3), ("dgx-h100", 4), ("dgx-a100", 2)])
def test_tree_depth_is_ceil_log2_nodes(preset, nodes):
    """NCCL's double binary tree over k nodes is ceil(log2 k) deep (chain of g GPUs inside):
    latency = base + 2 (g - 1) s_in + 2 ceil(log2 k) s_net (module doc; NCCL tuning.cc)."""
    system = get_system(preset, nodes=nodes)
    group = resolve_group(system, None)
    g, k = group.max_per_node, group.n_nodes
    assert k == nodes
    depth = 0
    while (1 << depth) < k:  # ceil(log2 k), counted
        depth += 1
    want = (system.soft("base_latency_us") + 2 * (g - 1) * system.fabric.step_latency_us
            + 2 * depth * system.network.step_latency_us)
    tree = {p.algorithm: p for p in plans(system, "allreduce", group)}["tree"]
    assert tree.latency_us == pytest.approx(want, rel=1e-12)


@pytest.mark.parametrize("nbytes", [2.0**20, 2.0**26, 2.0**30])
def test_alltoall_is_bound_by_a_nodes_shared_nics(nbytes):
    """Two 8-GPU PCIe nodes with 2 NICs each: in an all-to-all each rank sends nbytes/16 to each
    of the 8 ranks on the other node, so 8 x 8 x nbytes/16 bytes leave a node through its 2
    NICs. No all-to-all can beat that at the NICs' line rate."""
    system = get_system("pcie8", nodes=2)
    n, g = system.world_size, system.gpus_per_node
    assert system.nics_per_node < g  # the NICs are shared
    leaving = g * (n - g) * nbytes / n
    bound_ms = leaving / (system.nics_per_node * system.network.nic_bw_gbs * 1e9) * 1e3
    r = predict_collective("alltoall", nbytes, system)
    assert r.time_ms >= bound_ms


def test_nvls_reduce_scatter_and_all_gather_plans():
    """One NVSwitch node with NVLS: reduce-scatter and all-gather take an NVLS plan of one step
    (base + s_in) that moves (N-1)/N bytes per byte at the intra-node ring rate, plus half the
    reduction's HBM traffic (kappa/2 / M): per byte the same as the ring, never dearer.
    (The code prices it at the ring rate, not the NVLS all-reduce rate nvls_gbs, which is lower.)"""
    for preset in ("dgx-h100", "hgx-h200"):
        system = get_system(preset)
        group = resolve_group(system, None)
        n = group.size
        b_ring = group_ring_gbs(system, group) * 1e3
        kap = system.soft("hbm_bytes_per_byte") / 2 / (system.gpu.mem_bw_gbs * 1e3)
        assert nvls_gbs(system) * 1e3 < b_ring  # the two rates differ on these presets
        for kind in ("reducescatter", "allgather"):
            by = {p.algorithm: p for p in plans(system, kind, group)}
            nv, ring = by["nvls"], by["ring"]
            assert nv.latency_us == pytest.approx(system.soft("base_latency_us") + system.fabric.step_latency_us)
            assert nv.us_per_byte == pytest.approx((n - 1) / n / b_ring + kap, rel=1e-12)
            assert nv.us_per_byte <= ring.us_per_byte * (1 + 1e-12)


def test_nvls_sharp_pays_half_the_hbm_traffic():
    """NVLS inside a node and SHARP across nodes reduce in the switches: like the one-node NVLS
    all-reduce, the GPU's own HBM traffic is half a full reduction's (kappa/2 / M). Per byte:
    max(1 / nvls rate, 1 / node network rate) + kappa/2 / M."""
    system = get_system("dgx-h100", nodes=2, network="ib-ndr-sharp")
    assert system.network.sharp and system.fabric.nvls
    group = resolve_group(system, None)
    nvls = nvls_gbs(system) * 1e3
    b_net = node_net_gbs(system, group) * 1e3
    half = system.soft("hbm_bytes_per_byte") / 2 / (system.gpu.mem_bw_gbs * 1e3)
    plan = {p.algorithm: p for p in plans(system, "allreduce", group)}["nvls-sharp"]
    assert plan.us_per_byte == pytest.approx(max(1 / nvls, 1 / b_net) + half, rel=1e-12)
    # the same HBM term as the one-node NVLS all-reduce
    one = get_system("dgx-h100")
    single = {p.algorithm: p for p in plans(one, "allreduce", resolve_group(one, None))}["nvls"]
    assert plan.us_per_byte - max(1 / nvls, 1 / b_net) == pytest.approx(
        single.us_per_byte - 1 / (nvls_gbs(one) * 1e3), rel=1e-9)


@pytest.mark.parametrize("preset", ["dgx-h100", "dgx-a100", "pcie8"])
def test_bound_says_latency_when_the_floor_or_latency_beats_bandwidth(preset):
    """A collective is bandwidth-bound only when its bandwidth time exceeds both its latency and
    the framework-level floor; otherwise the label is "latency" (dgx-h100 all-reduce of 16 MiB:
    bandwidth over latency but under the floor)."""
    seen = set()
    for nbytes in np.logspace(10, 34, 49, base=2):
        r = predict_collective("allreduce", float(nbytes), preset)
        want = "bandwidth" if r.bandwidth_ms > max(r.latency_ms, r.floor_ms) else "latency"
        assert r.bound == want, (preset, nbytes, r)
        if r.latency_ms < r.bandwidth_ms <= r.floor_ms:
            seen.add("floor-bound")
    if preset == "dgx-h100":
        r = predict_collective("allreduce", 16 * 2.0**20, preset)
        assert r.latency_ms < r.bandwidth_ms < r.floor_ms and r.bound == "latency"
        assert "floor-bound" in seen
