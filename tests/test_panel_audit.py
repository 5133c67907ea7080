"""From a panels audit. The GEMM panel says what the prediction came from, as `kit op` does: a
GEMV has no tiles or waves (it claimed "1 tile ... last 4% full" beside a chart of 64 tiles), a
split-K GEMM says it is split, and a GEMM on Hopper's measured curve says its tiles are for the
picture. The collectives panel gives a small collective's busbw in significant figures."""
import re

import altair as alt

from kit.api import op_tiling, predict_op
from kit.ops import Gemm
from widgets.gemm import GemmPanel


def test_a_gemv_has_no_tiling_and_the_panel_says_so():
    op = Gemm(m=1, n=4096, k=4096)
    r = predict_op(op, "a100-sxm4-80gb")
    assert r["tile"] == "gemv" and op_tiling(op, "a100-sxm4-80gb") is None
    assert "tile_dims" not in r and "last_wave_fill" not in r
    panel = GemmPanel(m=1, n=4096, k=4096, gpu="a100-sxm4-80gb")
    text = panel.summary_text()
    assert "gemv" in text and "no GEMM tiles" in text and "wave (last" not in text
    assert f"predicted {r['latency_ms']:.4g} ms" in text
    chart = panel.make_chart().to_dict()  # the waves chart is a message, not a made-up tiling
    assert "gemv" in str(chart["hconcat"][0]) and "tiles of" not in str(chart["hconcat"][0])


def test_split_k_and_the_measured_curve_are_named():
    split = GemmPanel(m=64, n=576, k=100352, gpu="a100-pcie-80gb")
    r = split.result()
    assert r["split_k"] > 1 and f"split {r['split_k']} ways" in split.summary_text()
    curve = GemmPanel(m=4096, n=4096, k=4096, gpu="h100-sxm", dtype="bf16")
    assert curve.result()["source"] == "kit.predict.tensor_core"
    assert "measured tensor-core curve" in curve.summary_text()
    plain = GemmPanel(m=4096, n=4096, k=4096, gpu="a100-sxm4-80gb")
    assert "split" not in plain.summary_text() and "curve" not in plain.summary_text()
    assert isinstance(plain.make_chart(), alt.HConcatChart)


def test_a_small_collectives_busbw_is_not_zero():
    from kit.comm import predict_collective
    from widgets.collectives import CollectivesPanel

    text = CollectivesPanel(size_bytes=1024).summary_text()  # was "busbw 0.0 GB/s"
    shown = float(re.search(r"busbw ([0-9.e+-]+) GB/s", text).group(1))
    want = predict_collective("allreduce", 1024, "dgx-h100").busbw_gbs
    assert shown > 0 and shown == float(f"{want:.3g}")
