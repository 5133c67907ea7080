"""kit op's source line names the rule that set an op's time where a row's latency, an element
rate or the long-reduction cap did (kit.predict.op_source): each had set times with no word of
it, so a carried, unmeasured bound (a bf16 softmax on an MI210) read like the tile-MLP's answer."""
import pytest

from kit.api import predict_op
from kit.hardware import get_gpu
from kit.ops import Elementwise, Gemm, Softmax
from kit.predict import cdna_softmax, get_predictor
from kit.predict.element_rates import element_bound_ms, softmax_row_ms
from kit.workload.kernel_times import isolation_floor_ms


def _floor(gpu):
    return isolation_floor_ms(get_predictor("tile"), get_gpu(gpu))


def test_amd_block_softmax_says_so_and_whether_it_is_carried():
    fp32 = predict_op(Softmax(4096, 2048), "mi210")
    assert fp32["source"].startswith("ROCm's block softmax")
    assert "carried" not in fp32["source"]
    block = cdna_softmax.block_softmax_ms([4096], [2048], get_gpu("mi210"), 4)[0]
    assert fp32["latency_ms"] == pytest.approx(_floor("mi210") + block, rel=1e-9)
    bf16 = predict_op(Softmax(4096, 2048, "bf16"), "mi210")
    assert bf16["source"].startswith("ROCm's block softmax") and "carried, not measured: a bf16 row" in bf16["source"]
    # the slope it prints is the one it takes: per byte, half the fp32 column's (found by review)
    a, b = cdna_softmax.CDNA_SOFTMAX_ROW_CLOCKS["smem"]
    assert f"{a:.0f} + {b / 2:.3g} x cols clocks" in bf16["source"] and "so its band is wider" in bf16["source"]
    far = predict_op(Softmax(4096, 8192), "mi300x")
    assert "rows over 4,096 columns" in far["source"] and "the mi300x is neither" in far["source"]
    # a warp-kernel row (1,024 columns) on AMD is not the block line's
    assert not str(predict_op(Softmax(4096, 1000), "mi210").get("source", "")).startswith("ROCm's")


@pytest.mark.parametrize("gpu", ["h200", "l4"])
def test_few_softmax_rows_take_one_rows_latency(gpu):
    r = predict_op(Softmax(16, 1024, "bf16"), gpu)
    assert r["source"].startswith("one row's latency in PyTorch's warp softmax kernel")
    assert ("read on the H200, taken to the" in r["source"]) == (gpu != "h200")
    row = softmax_row_ms([1024], get_gpu(gpu), "bf16")[0]
    assert r["latency_ms"] == pytest.approx(_floor(gpu) + row, rel=1e-9)
    many = predict_op(Softmax(1 << 20, 1024, "fp32"), gpu)  # its bytes bind: no such line
    assert not str(many.get("source", "")).startswith("one row's latency")
    fp16 = predict_op(Softmax(16, 1024, "fp16"), gpu)["source"]  # the line was read in fp32 and bf16
    assert "fp16 (it was read in fp32 and bf16)" in fp16 and "band is wider" not in fp16


def test_softmax_rows_past_the_warp_kernel_say_they_count_as_rows_of_2048():
    """Found by review: rows of 4,096 on an H200 had read as 'at the rate for rows of this length',
    where the bound counts them as rows of 2,048 at the 1,025-2,048 band's rate."""
    r = predict_op(Softmax(200_000, 4096, "bf16"), "h200")
    assert r["source"].startswith("its rows counted as rows of 2,048")
    assert "rows over 2,048 run a block per row" in r["source"]
    # rows of up to 512: the rate was read in bf16 alone (fp32's bytes bound first there)
    short = predict_op(Softmax(20_000, 512, "fp32"), "b200")["source"]
    assert short.startswith("its elements at the warp softmax kernel's rate") and "fp32 (rows this short" in short


def test_an_element_rate_says_which_and_where_it_was_measured():
    h200 = predict_op(Elementwise("pow", 50_000_000, "bf16"), "h200")
    assert h200["source"].startswith("its 50,000,000 elements at 1.3 per SM per clock")
    bound = element_bound_ms(["pow"], [50_000_000], get_gpu("h200"))[0]
    assert h200["latency_ms"] == pytest.approx(_floor("h200") + bound, rel=1e-9)
    a100 = predict_op(Elementwise("gelu", 50_000_000, "bf16"), "a100-pcie-80gb")
    assert "read on the H200, taken to the a100-pcie-80gb" in a100["source"]
    mi100 = predict_op(Elementwise("pow", 50_000_000), "mi100")
    assert "0.428 per CU per clock" in mi100["source"] and "carried" not in mi100["source"]
    # AMD's rate was read in fp32, NVIDIA's gelu in bf16: other dtypes take them carried
    assert "bf16 (it was read in fp32)" in predict_op(Elementwise("pow", 50_000_000, "bf16"), "mi100")["source"]
    assert "fp16 (it was read in bf16)" in predict_op(Elementwise("gelu", 50_000_000, "fp16"), "h200")["source"]
    assert "source" not in predict_op(Elementwise("add", 50_000_000, "bf16"), "h200")  # bytes bind


def test_the_long_reduction_cap_says_so_and_when_it_is_carried():
    op = Gemm(m=2048, n=64, k=2048, b=32)
    r = predict_op(op, "t4")
    assert r["source"].startswith("its k = 1,024 twin's kernel time scaled by k / 1,024 (2x)")
    assert r["latency_ms"] == pytest.approx(get_predictor("tile").long_reduction_ms([op], "t4")[0], rel=1e-9)
    assert "carried past k = 4,096" not in r["source"]
    assert "carried past k = 4,096" in predict_op(Gemm(m=2048, n=64, k=8192, b=32), "t4")["source"]
    # the cap takes no GEMM whose own answer is faster, and no 16-bit one
    assert not str(predict_op(Gemm(m=2048, n=64, k=1024, b=32), "t4").get("source", "")).startswith("its k =")
    assert not str(predict_op(Gemm(m=2048, n=64, k=2048, b=32, dtype="fp16"), "t4").get("source", "")).startswith("its k =")


def test_kit_op_prints_the_source_line(capsys):
    from kit.cli import main

    assert main(["op", "softmax", "--rows", "4096", "--cols", "2048", "--gpu", "mi210", "--dtype", "bf16"]) == 0
    out = capsys.readouterr().out
    assert "source    ROCm's block softmax" in out and "carried, not measured" in out
    assert main(["op", "elementwise", "--kind", "pow", "--numel", "50000000", "--gpu", "h200",
                 "--dtype", "bf16"]) == 0
    assert "source    its 50,000,000 elements at 1.3 per SM per clock" in capsys.readouterr().out
