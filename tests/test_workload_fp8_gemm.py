"""torch._scaled_mm (FP8 GEMMs) is costed as the fp8 GEMM it is (kit.workload.mapping_gemm._scaled),
not as an unknown op of its bytes and a cube of its FLOPs."""
import pytest
import torch
from torch import nn

from kit.errors import KitError
from kit.ops import Gemm
from kit.workload.capture import capture
from kit.workload.iteration import iteration

E4M3 = torch.float8_e4m3fn


class ScaledLinear(nn.Module):
    """An FP8 Linear as torchao / TransformerEngine-style code calls it: x cast to fp8, the
    weight held in fp8 (k, n) column-major, per-tensor scales, a bf16 output."""

    def forward(self, x, w):
        one = torch.tensor(1.0)
        return torch._scaled_mm(x.to(E4M3), w.t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16)


def _scaled_node(m, k, n):
    g = capture(ScaledLinear(), (torch.empty(m, k), torch.empty(n, k, dtype=E4M3)), mode="inference")
    [node] = [x for x in g if x.name() == "_scaled_mm"]
    return g, node


@pytest.mark.parametrize("m,k,n", [(2048, 4096, 4096), (4, 4096, 14336)])
def test_scaled_mm_is_an_fp8_gemm_of_its_own_shape(m, k, n):
    _, node = _scaled_node(m, k, n)
    assert node.op_class == "gemm"
    assert isinstance(node.op, Gemm)
    assert (node.op.m, node.op.n, node.op.k, node.op.b, node.op.dtype) == (m, n, k, 1, "fp8")
    assert node.op.flops == 2 * m * n * k
    # the operands it reads, one byte an element (the weight alone is 4096 x 14336 = 58.7 MB)
    assert node.op.bytes >= m * k + k * n


def test_a_decode_shaped_scaled_mm_takes_at_least_its_weight_at_peak_bandwidth_and_less_than_bf16():
    """A GEMV of 4 rows reads its fp8 weight once: never under that stream, and faster than the
    bf16 GEMM of the same shape, which reads twice the bytes."""
    from kit.hardware import get_gpu

    gpu = get_gpu("h100-sxm")
    m, k, n = 4, 4096, 14336
    g, node = _scaled_node(m, k, n)
    it = iteration(g, gpu)
    row = it.timeline[it.timeline.aten == "_scaled_mm"].iloc[0]
    assert row.op_class == "gemm"
    weight_ms = k * n / gpu.mem_bw_bytes_per_s * 1e3
    assert row.latency_ms >= weight_ms
    from kit.workload.kernel_times import isolated_latencies

    fp8, bf16 = isolated_latencies([node.op, Gemm(m, n, k, dtype="bf16", kind="linear", shared_rhs=True)],
                                   gpu)[:, 0]
    assert fp8 < bf16


def test_a_scaled_mm_on_a_gpu_without_fp8_is_refused_by_name():
    g, _ = _scaled_node(256, 512, 512)
    with pytest.raises(KitError, match="fp8"):
        iteration(g, "a100-pcie-40gb")


class ScaledGrouped(nn.Module):
    def forward(self, x, w, offs):
        return torch._scaled_grouped_mm(x, w.transpose(-2, -1), torch.ones(x.shape[0]),
                                        torch.ones(w.shape[0], w.shape[1]), offs=offs,
                                        out_dtype=torch.bfloat16)


def test_scaled_grouped_mm_is_the_grouped_fp8_gemm_of_its_tokens():
    tokens, experts, k, n = 1024, 8, 512, 256
    x, w = torch.empty(tokens, k, dtype=E4M3), torch.empty(experts, n, k, dtype=E4M3)
    offs = torch.arange(tokens // experts, tokens + 1, tokens // experts, dtype=torch.int32)
    g = capture(ScaledGrouped(), (x, w, offs), mode="inference")
    [node] = [x for x in g if x.name() == "_scaled_grouped_mm"]
    assert node.op_class == "gemm" and node.op.dtype == "fp8"
    assert node.op.flops == pytest.approx(2 * tokens * k * n)


@pytest.mark.skipif(not hasattr(torch, "float4_e2m1fn_x2"), reason="this torch has no fp4 dtype")
def test_an_fp4_scaled_mm_is_refused_not_costed_as_an_fp8_gemm_of_half_its_k():
    """NVFP4 operands pack two values a byte: (m, k/2) by (k/2, n) is a GEMM of inner size k, which
    the kit cannot price (no fp4 peak); it had been an fp8 GEMM of k/2, half its FLOPs."""
    fp4 = torch.float4_e2m1fn_x2
    m, k, n = 256, 1024, 512

    class Fp4Linear(nn.Module):
        def forward(self, x, w):
            sa = torch.ones(m, k // 16, dtype=E4M3)
            sb = torch.ones(n, k // 16, dtype=E4M3)
            return torch._scaled_mm(x, w.t(), sa, sb, out_dtype=torch.bfloat16)

    with pytest.raises(KitError, match="fp4"):
        capture(Fp4Linear(), (torch.empty(m, k // 2, dtype=fp4), torch.empty(n, k // 2, dtype=fp4)),
                mode="inference")
