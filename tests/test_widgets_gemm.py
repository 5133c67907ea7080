"""The GEMM panel, driven by setting widget values (no kernel, no browser)."""
import math

from kit.hardware import get_gpu
from widgets.gemm import GemmPanel


def _waves(panel):
    rows = [r for r in panel.chart_data() if "wave" in r]
    return {r["wave"] for r in rows}, sum(r["blocks"] for r in rows if r["kind"] == "tiles")


def test_panel_redraws_when_the_shape_changes():
    p = GemmPanel(m=1024, n=1024, k=1024, gpu="a100-pcie-40gb")
    waves_before, tiles_before = _waves(p)
    p.n.value = 8192  # 8x the tiles
    waves_after, tiles_after = _waves(p)
    assert tiles_after > tiles_before
    assert p.chart_widget.chart is p.chart
    tm, tn = p.result()["tile_dims"][:2]  # kit orientation: tm rows of C, tn columns
    assert tiles_after == math.ceil(1024 / tm) * math.ceil(8192 / tn)


def test_panel_follows_the_gpu_picker():
    p = GemmPanel(m=4096, n=4096, k=4096, gpu="t4")
    p.gpu.value = "h100-sxm"
    gpus = {r["gpu"] for r in p.chart_data() if "gpu" in r}
    assert "h100-sxm" in gpus
    ridge = [r for r in p.chart_data() if r.get("gpu") == "h100-sxm" and "ridge_flops_per_byte" in r]
    gpu = get_gpu("h100-sxm")
    assert abs(ridge[0]["ridge_flops_per_byte"] - gpu.fp32_tflops * 1e3 / gpu.mem_bw_gbs) < 1e-6


def test_unsupported_dtype_shows_a_message_not_an_error():
    p = GemmPanel(gpu="v100-pcie-32gb")
    p.dtype.value = "fp8"
    assert "no fp8 support" in str(p.chart_data())
    assert "no fp8 support" in p.summary.value and "pick another dtype" in p.summary.value


def test_a_gemm_beyond_the_gpu_memory_shows_a_message_not_an_error():
    p = GemmPanel(gpu="t4")
    for w in (p.m, p.n, p.k):
        w.value = 65536   # three fp32 65536² matrices: 48 GiB, a T4 has 16
    assert "48 GiB" in str(p.chart_data()) and "16 GiB" in p.summary.value
    p.gpu.value = "h100-sxm"   # 80 GiB: it fits, and the panel predicts it again
    assert "waves" in p.summary.value


def test_stable_text_repr():
    p = GemmPanel()
    data, _ = p._repr_mimebundle_()
    assert data["text/plain"] == "<GEMM on a GPU: tiles, waves and the roofline panel>"


def test_summary_and_waves_picture_tell_the_same_story():
    """The bars are drawn from the tile the predictor chose, so tiles and waves agree with it."""
    p = GemmPanel(m=4097, n=4096, k=4096, gpu="a100-sxm4-80gb")
    for dtype in ("fp32", "bf16"):
        p.dtype.value = dtype
        r = p.result()
        waves, tiles = _waves(p)
        assert len(waves) == r["waves"] or r["waves"] > 64  # the chart caps its bars at 64 waves
        assert tiles == r["tiles"]


def test_panel_names_the_tensor_core_curve_measured_or_carried():
    p = GemmPanel(m=4096, n=4096, k=4096, gpu="h100-sxm")
    p.dtype.value = "bf16"
    assert "Hopper's measured tensor-core curve" in p.summary_text()
    p.gpu.value = "a100-sxm4-80gb"
    assert "carried to this GPU" in p.summary_text()
    p.dtype.value = "fp32"
    assert "tensor-core curve" not in p.summary_text()


def test_panel_says_when_the_tile_choice_is_unsure():
    # the chooser gives 2048 x 2048 x 1024 on an A100 40GB two tiles within its margin (kit op's
    # choice line; 3072 x 3072 x 1024 before the P4's Linear training rows were left out)
    p = GemmPanel(m=2048, n=2048, k=1024, gpu="a100-pcie-40gb")
    mixed = [c for c in p.result()["tile_choice"] if c["weight"] > 0]
    assert len(mixed) > 1 and "tile choice is unsure" in p.summary_text()
    assert all(c["tile"] in p.summary_text() for c in mixed)
    # at k = 4,096 the long-reduction cap sets its time, not the tiles: the panel says so
    p.k.value = 4096
    assert "unsure" not in p.summary_text() and "set by its k = 1,024 twin's kernel time" in p.summary_text()
    p.gpu.value = "h100-sxm"
    p.dtype.value = "bf16"  # a curve, not the tiles, sets the time: no such note
    assert "unsure" not in p.summary_text()
