"""In the stream a node sheds the dispatch floors its isolated prediction holds: one a prediction
it sums, scaled as the prediction is (kit.workload.kernel_times.in_stream_ms). A node standing
for k kernels but priced as one op (a layer norm's backward: 2 kernels, one copy of its bytes)
holds one floor; shedding one a kernel had taken 12.7 us (H100) it never held. No expected time
is written down: each side is the kit's own isolated prediction and floor."""
import pytest
import torch

from kit.hardware import get_gpu
from kit.ops import Gemm
from kit.predict import get_predictor
from kit.workload.graph import Node
from kit.workload.kernel_times import (KERNEL_MIN_US, isolated_latencies, isolation_floor_ms,
                                       predict_latencies)
from kit.workload.kernels import Derived
from kit.workload.mapping import map_op

GPU = "h100-sxm"


def _stream_ms(op, kernels: int) -> float:
    node = Node(0, "aten.x.default", op, "memcpy", "bwd", kernels=kernels)
    return float(predict_latencies([node], GPU, "tile")[0][0])


def _one_piece_ops():
    """Ops the capture maps to several kernels priced as one op: (name, op, kernels)."""
    with torch.device("meta"):
        # large enough that the prediction less its floors stays over the least time
        x, dy = (torch.empty(8, 4096, 4096, dtype=torch.bfloat16) for _ in range(2))
        w = torch.empty(4096, dtype=torch.bfloat16)
        mean, rstd = torch.empty(8, 4096, 1), torch.empty(8, 4096, 1)
        out = (torch.empty_like(x), torch.empty_like(w), torch.empty_like(w))
        ln = map_op("native_layer_norm_backward", (dy, x, [4096], mean, rstd, w, w, [True] * 3), {}, out)
        grad = torch.empty(8, 4096, 2048, dtype=torch.bfloat16)
        sl = map_op("slice_backward", (grad, [8, 4096, 4096], 2, 0, 2048, 1), {}, torch.empty_like(x))
    return [("native_layer_norm_backward", ln[0], ln[2]), ("slice_backward", sl[0], sl[2])]


@pytest.mark.parametrize("name,op,kernels", _one_piece_ops())
def test_a_node_of_several_kernels_priced_as_one_op_sheds_one_floor(name, op, kernels):
    tile = get_predictor("tile")
    floor = isolation_floor_ms(tile, get_gpu(GPU))
    assert kernels > 1 and floor > 0
    isolated = float(isolated_latencies([op], GPU, tile)[0, 0])
    (leaf,) = op.parts  # a copy of its bytes
    roof = float(tile.predict([leaf], GPU).roofline_ms.iloc[0])
    # well above the least time even with every kernel's floor out: the shed floors set it
    assert isolated - kernels * floor > roof + kernels * KERNEL_MIN_US / 1e3
    # its one prediction held one floor, whatever kernels the node stands for
    assert _stream_ms(op, kernels) == pytest.approx(isolated - floor, rel=1e-9)
    assert _stream_ms(op, kernels) == pytest.approx(_stream_ms(op, 1), rel=1e-9)


def test_each_kernel_keeps_its_start_in_the_least_time():
    # a tiny node of 2 kernels: its floor swallows it, and the least time counts both starts
    with torch.device("meta"):
        x = torch.empty(4, 8)
        w = torch.empty(8)
        op, _, kernels = map_op("native_layer_norm_backward",
                                (x, x, [8], torch.empty(4, 1), torch.empty(4, 1), w, w, [True] * 3), {},
                                (torch.empty_like(x), torch.empty_like(w), torch.empty_like(w)))
    isolated = float(isolated_latencies([op], GPU, "tile")[0, 0])
    (leaf,) = op.parts  # a copy of its bytes
    roof = float(get_predictor("tile").predict([leaf], GPU).roofline_ms.iloc[0])
    least = roof + kernels * KERNEL_MIN_US / 1e3
    assert least < isolated
    assert _stream_ms(op, kernels) == pytest.approx(least, rel=1e-9)


@pytest.mark.parametrize("scale", [0.5, 2.8, 7.0])
def test_a_scaled_prediction_sheds_its_floor_scaled(scale):
    # scale x (the op's kernel + its floor): in the stream, scale x the op's own stream time (a
    # dropout backward, 0.83 x a multiply's pass, had shed a whole floor from 0.83 of one)
    base = Gemm(m=4096, n=4096, k=4096, dtype="bf16")  # its prediction 1.4x its roofline
    scaled = Derived("elementwise", (base,), scale, "scaled")
    assert _stream_ms(scaled, 1) == pytest.approx(scale * _stream_ms(base, 1), rel=1e-9)


def test_the_multi_gpu_costing_sheds_the_same_floors():
    from kit.hardware.system import get_system
    from kit.parallel import Layout
    from kit.parallel.costs import Coster

    op = _one_piece_ops()[0][1].parts[0]  # the layer norm backward's copy
    coster = Coster(Layout(micro_batch=1, dtype="bf16"), get_system("dgx-a100"), predictor="tile")
    coster.predict_ops([op])
    assert coster.floor_ms > 0
    assert coster.op_ms(op, 1.0, kernels=2) == pytest.approx(coster.op_ms(op, 1.0, kernels=1), rel=1e-9)
    assert coster.op_ms(op, 0.5) == pytest.approx(0.5 * coster.op_ms(op, 1.0), rel=1e-9)
