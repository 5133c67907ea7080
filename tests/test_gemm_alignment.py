"""16-bit GEMMs whose leading dimensions are not 16-byte aligned: the capture reads the alignment
off the operands' strides, and on Hopper the tile predictor runs such a GEMM against the share of
the rate per SM-clock cuBLAS's fallback kernels reached on an H200 (kit.predict.features.unaligned_peak_share)."""
import pytest

from kit.errors import KitError
from kit.hardware import get_gpu
from kit.ops import Gemm, lead_alignment
from kit.predict import get_predictor
from kit.predict.features import UNALIGNED_SHARE_ON_H200, op_from_row, unaligned_peak_share
from kit.predict.split_k import split_op
from kit.workload.models import graph_of


@pytest.mark.parametrize("dims,align", [((768, 3072), 8), ((50257,), 1), ((30522, 768), 2),
                                        ((12, 8), 4), ((64, 50257, 768), 1), ((16, 24), 8)])
def test_lead_alignment(dims, align):
    assert lead_alignment(*dims) == align
    assert all(d % align == 0 for d in dims)


def test_gemm_align_is_checked():
    assert Gemm(m=8, n=8, k=8).lead_align == 8  # no layout given: taken as aligned
    assert Gemm(m=8, n=8, k=8, align=2).lead_align == 2
    for bad in (3, 0, 16, 2.0):
        with pytest.raises(KitError, match="align"):
            Gemm(m=8, n=8, k=8, align=bad)


def test_a_measured_row_takes_n_and_k():
    row = {"op": "linear", "op_class": "gemm", "dtype": "bf16", "b": 1, "m": 7, "n": 50257, "k": 768}
    assert op_from_row(row).lead_align == 1
    assert op_from_row({**row, "n": 4096}).lead_align == 8  # m is no leading dimension of x @ W^T


def test_the_capture_reads_the_strides():
    """An odd vocabulary puts all three of the LM head's GEMMs on the unaligned path, the weight
    gradient's included (there the vocabulary is m, leading a transposed operand); every other
    GEMM of the model is aligned."""
    tiny = {"model_type": "gpt2", "n_embd": 64, "n_head": 2, "n_layer": 1, "vocab_size": 101,
            "n_positions": 64, "name": "odd-vocab"}
    graph = graph_of(tiny, 2, 32, "train", "bf16")
    gemms = [n for n in graph.nodes if getattr(n.op, "op_class", None) == "gemm"]
    odd = [n for n in gemms if 101 in (n.op.m, n.op.n, n.op.k)]
    assert len(odd) == 3 and {n.phase for n in odd} == {"fwd", "bwd"}
    assert any(n.op.m == 101 for n in odd)  # the weight gradient
    assert all(n.op.lead_align == 1 for n in odd)
    assert all(n.op.lead_align == 8 for n in gemms if n not in odd)


def test_unaligned_16bit_gemms_run_at_the_h200s_rate_per_sm_clock():
    h200, a100 = get_gpu("h200"), get_gpu("A100-SXM4-80GB")
    assert unaligned_peak_share(h200, "bf16", [1, 2, 4, 8]).tolist() == pytest.approx([
        UNALIGNED_SHARE_ON_H200[1], UNALIGNED_SHARE_ON_H200[2], UNALIGNED_SHARE_ON_H200[4], 1.0])
    assert unaligned_peak_share(h200, "bf16", [1, 1], [1, 2]).tolist() == pytest.approx(
        [1.0, UNALIGNED_SHARE_ON_H200[1]])
    assert unaligned_peak_share(h200, "fp32", [1]) == 1.0  # SIMT/TF32 kernels: not measured
    # the same FLOP per SM-clock on an A100: a larger share of its smaller peak
    per_clock = lambda g: g.sm_count * g.boost_clock_mhz * 1e6  # noqa: E731
    a100_share = unaligned_peak_share(a100, "bf16", [1])[0]
    assert a100_share * a100.gemm_peak_flops_per_s("bf16") / per_clock(a100) == pytest.approx(
        UNALIGNED_SHARE_ON_H200[1] * h200.gemm_peak_flops_per_s("bf16") / per_clock(h200), rel=1e-3)
    assert 0.2 < a100_share < 0.3
    assert unaligned_peak_share(get_gpu("mi300x"), "bf16", [1]) == 1.0  # another vendor's kernels
    tile = get_predictor("tile")
    odd = Gemm(m=8192, n=50257, k=768, dtype="bf16", kind="linear", shared_rhs=True, align=1)
    even = Gemm(m=8192, n=50304, k=768, dtype="bf16", kind="linear", shared_rhs=True, align=8)
    on_h200 = tile.predict([odd, even], h200).latency_ms.to_numpy()
    assert on_h200[0] > 3 * on_h200[1]  # 13% of the peak against all of it
    on_a100 = tile.predict([odd, even], a100).latency_ms.to_numpy()
    assert on_a100[0] > 2 * on_a100[1]
    # the ranking no longer inverts: an odd-vocabulary head is not faster on an A100 than on Hopper
    assert on_a100[0] > on_h200[0]
    fp32 = tile.predict([Gemm(m=8192, n=50257, k=768, kind="linear", shared_rhs=True, align=1),
                         Gemm(m=8192, n=50304, k=768, kind="linear", shared_rhs=True, align=8)], h200)
    assert fp32.latency_ms.iloc[0] == pytest.approx(fp32.latency_ms.iloc[1], rel=0.05)


def test_a_split_keeps_the_operands_strides():
    op = Gemm(m=64, n=4096, k=4096, dtype="bf16", align=8)
    assert split_op(op, 3).k == 1366 and split_op(op, 3).lead_align == 8
    assert split_op(Gemm(m=64, n=4097, k=4096, align=1), 2).lead_align == 1


def test_volta_and_amd_keep_the_whole_peak_turing_does_not():
    assert unaligned_peak_share(get_gpu("v100-sxm2-32gb"), "fp16", [1]) == 1.0
    assert unaligned_peak_share(get_gpu("t4"), "fp16", [1])[0] < 1.0
