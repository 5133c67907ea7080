"""Elementwise kernels PyTorch cannot vectorize (a broadcast, a 0-dim device tensor, a strided
input): the capture marks them, and a whole-model prediction gives each at least the time the
generic loop takes at GENERIC_LOOP_ELEMS_PER_SM_CLOCK (kit.workload.iteration)."""
from types import SimpleNamespace

import pytest
import torch

from kit.errors import KitError
from kit.hardware import get_gpu
from kit.ops import Elementwise
from kit.workload.capture import capture
from kit.workload.iteration import GENERIC_LOOP_ELEMS_PER_SM_CLOCK, generic_loop_ms, predict_latencies
from kit.workload.kernels import Derived
from kit.workload.mapping import vectorizable


def meta(*shape):
    return torch.empty(*shape, device="meta")


def test_what_pytorch_vectorizes():
    out = meta(4, 8, 16)
    assert vectorizable([meta(4, 8, 16), meta(4, 8, 16)], out)
    assert vectorizable([meta(4, 8, 16), torch.tensor(2.0)], out)  # a CPU scalar: passed by value
    assert not vectorizable([meta(4, 8, 16), meta(16)], out)  # a broadcast bias
    assert not vectorizable([meta(4, 8, 16), meta(())], out)  # a 0-dim tensor on the device
    assert not vectorizable([meta(4, 16, 8).transpose(1, 2)], out)  # a permute's copy
    assert not vectorizable([meta(4, 8, 16)], meta(4, 16, 8).transpose(1, 2))


class Scale(torch.nn.Module):
    def forward(self, x):
        y = x * 2.0  # a Python scalar: vectorized
        y = y * torch.tensor(3.0, device=x.device)  # HF's torch.tensor(finfo.min, device=...)
        return y.transpose(1, 2).contiguous()  # a strided copy


def test_the_capture_marks_them():
    graph = capture(Scale(), (torch.empty(2, 8, 16),), mode="inference", dtype="bf16")
    ew = [n.op for n in graph.nodes if n.op_class == "elementwise"]
    flat = [op.parts[0] if isinstance(op, Derived) else op for op in ew]
    assert [op.vectorized for op in flat] == [True, False, False]
    with pytest.raises(KitError, match="vectorized"):
        Elementwise("mul", 8, vectorized="no")


def test_a_generic_loop_takes_its_elements_time():
    h200 = get_gpu("h200")
    n = 1 << 27
    generic = SimpleNamespace(op=Elementwise("mul", n, "bf16", inputs=1, vectorized=False), kernels=1,
                              op_class="elementwise")
    fast = SimpleNamespace(op=Elementwise("mul", n, "bf16", inputs=1), kernels=1, op_class="elementwise")
    rate = GENERIC_LOOP_ELEMS_PER_SM_CLOCK * h200.sm_count * h200.boost_clock_mhz * 1e6
    assert generic_loop_ms([generic, fast], h200).tolist() == pytest.approx([n / rate * 1e3, 0.0])
    lat, p10, p90, _, _ = predict_latencies([generic, fast], h200, "tile")
    assert lat[0] >= n / rate * 1e3 - 1e-12 and p10[0] >= n / rate * 1e3 - 1e-12
    assert lat[1] < n / rate * 1e3  # bytes alone: the memory streams it faster
    assert generic_loop_ms([generic], get_gpu("mi210")).tolist() == [0.0]  # measured on NVIDIA only


def test_the_multi_gpu_coster_costs_them_the_same_way():
    from kit.parallel import Layout
    from kit.parallel.costs import Coster
    from kit.hardware.system import get_system

    system = get_system("dgx-a100")
    n = 1 << 27
    generic = Elementwise("mul", n, "bf16", inputs=1, vectorized=False)
    fast = Elementwise("mul", n, "bf16", inputs=1)
    coster = Coster(Layout(), system, "tile")
    coster.predict_ops([generic, fast])
    bound = n / (GENERIC_LOOP_ELEMS_PER_SM_CLOCK * system.gpu.sm_count * system.gpu.boost_clock_mhz * 1e6) * 1e3
    assert coster.op_ms(generic) == pytest.approx(bound * coster.other_scale)
    assert coster.op_ms(fast) < coster.op_ms(generic)
    roof = Coster(Layout(), system, "roofline")
    roof.predict_ops([generic])
    assert roof.op_ms(generic) < bound  # the roofline stays a bound on the bytes


def test_a_cheapest_takes_the_generic_floor_of_the_way_it_runs():
    """Found by review: the generic loop's floor came from a node's nominal (first) way, applied
    after the choice, so a Cheapest whose second way won reported the first way's floor."""
    from types import SimpleNamespace

    from kit.workload.kernels import Cheapest

    slow = Elementwise("add", 1 << 24, "bf16", vectorized=False)
    fast = Elementwise("add", 1024, "bf16")
    node = SimpleNamespace(op=Cheapest("fused", (slow, fast)), kernels=1)
    lat, _, _, _, _, taken = predict_latencies([node], get_gpu("h200"), "tile", with_option=True)
    alone = predict_latencies([SimpleNamespace(op=fast, kernels=1)], get_gpu("h200"), "tile")[0]
    assert taken[0] == 1
    assert lat[0] == pytest.approx(alone[0], rel=1e-12)
    assert lat[0] < generic_loop_ms([SimpleNamespace(op=slow, kernels=1)], get_gpu("h200"))[0]


def test_a_roll_is_costed_as_the_offset_computing_kernel_cuda_runs():
    """torch.roll on CUDA (one dim) is roll_cuda_kernel, one element a thread, each source
    offset found with a 64-bit % and /: never the vectorized loop, however contiguous its input.
    HF 5.25 shifts a full static sliding window with it (cache_utils.py:575-584: roll, put the
    new row at [-1], copy_ back), where a cat of the window's last rows and the new one had
    been costed: that shift reads and writes at least as many bytes as the cat and copy_ did,
    so it cannot be predicted faster (gemma2-9b, batch 8, 8,192 cached, bf16 on an H100: its
    roll had been priced as a vectorized copy, 99.5 us a layer's keys against the strided
    cat's 191.6, and the step had come out 94.96 -> 91.28 ms, faster)."""
    from kit.workload.mapping import map_op

    b, kv, w, d = 8, 8, 4096, 256
    window = torch.empty(b, kv, w, d, dtype=torch.bfloat16, device="meta")
    new = torch.empty(b, kv, 1, d, dtype=torch.bfloat16, device="meta")
    roll, op_class, kernels = map_op("roll", (window, -1, -2), {}, torch.empty_like(window))
    assert (op_class, kernels) == ("elementwise", 1)
    assert not roll.vectorized
    assert roll.bytes == 2 * (b * kv * w * d * 2)  # the window read once and written once, bf16
    idx = torch.empty(1, dtype=torch.long, device="meta")
    put = map_op("index_put_", (window, [None, None, idx], new), {}, window)[0]
    copy = map_op("copy_", (window, window), {}, window)[0]
    cat = map_op("cat", ([window[:, :, 1:], new], 2), {}, torch.empty_like(window))[0]
    h100 = get_gpu("h100-sxm")
    ops = [SimpleNamespace(op=op, kernels=1, op_class=op.op_class) for op in (roll, put, copy, cat)]
    lat = predict_latencies(ops, h100)[0]
    assert roll.bytes + put.bytes + copy.bytes >= cat.bytes + copy.bytes
    assert lat[0] + lat[1] + lat[2] >= lat[3] + lat[2]  # roll, index_put_, copy_ vs cat, copy_
    rate = GENERIC_LOOP_ELEMS_PER_SM_CLOCK * h100.sm_count * h100.boost_clock_mhz * 1e6
    assert lat[0] >= b * kv * w * d / rate * 1e3 - 1e-12
