"""Audit of the notebook series and its panels, as a workshop participant would use them: every
control through its range, edge values, and the figures the prose quotes. Each test fails
without the fix it guards."""
import math

import numpy as np
import pandas as pd
import pytest

import widgets.tile_predictor as tp
from widgets.tile_predictor import MAX_POINTS, TilePredictorPanel


def _finite(rows):
    return all(not (isinstance(v, float) and (math.isnan(v) or math.isinf(v)))
               for r in rows for k, v in r.items() if k != "ape")


def _rows(gpu, n, ape):
    """n measured rows of one GPU whose prediction is off by `ape` per cent (band +-1%)."""
    measured = np.full(n, 1.0)
    pred = measured * (1 + ape / 100)
    return pd.DataFrame({"predictor": "tile", "gpu": gpu, "op": "bmm", "op_class": "gemm",
                         "measured_ms": measured, "predicted_ms": pred, "p10_ms": pred * 0.99,
                         "p90_ms": pred * 1.01, "tile": "128x128", "ape": ape})


# -- tile-predictor panel --------------------------------------------------------------------
def test_tile_summary_covers_every_row_not_only_the_drawn_ones():
    # 3,000 rows 10% off, then 1,000 rows 50% off: the chart draws MAX_POINTS of the 4,000,
    # but the summary's count and MAPE are of all 4,000 (by hand: (3000*10 + 1000*50) / 4000)
    rows = pd.concat([_rows("l4", 3000, 10.0), _rows("l4", 1000, 50.0)], ignore_index=True)
    p = TilePredictorPanel(rows=rows)
    assert len([r for r in p.chart_data() if "op" in r]) == MAX_POINTS
    assert p.summary.value.startswith(f"4000 kernels (chart shows {MAX_POINTS} of them)")
    assert f"MAPE {(3000 * 10 + 1000 * 50) / 4000:.1f}%" in p.summary.value


def test_tile_panel_offers_a_gpu_the_test_set_never_measured(monkeypatch):
    monkeypatch.setattr(tp, "measured_rows", lambda gpus, *a, **k: _rows("a100-pcie-80gb", 20, 5.0))
    p = TilePredictorPanel(gpus=("a100-pcie-80gb", "H200"))  # was: h200 silently dropped
    assert list(p.gpu.options) == ["a100-pcie-80gb", "h200"]
    assert "MAPE 5.0%" in p.summary.value
    p.gpu.value = "h200"
    pts = [r for r in p.chart_data() if "op" in r]
    assert pts and _finite(pts) and all(r["predicted_ms"] >= r["measured_ms"] for r in pts)
    assert "none of h200" in p.summary.value
    only = TilePredictorPanel(gpus=("mi210",))  # was: IndexError on an empty GPU list
    assert only.gpu.value == "mi210" and only.chart_data()


def test_tile_panel_without_data_sweeps_the_chosen_op_class(monkeypatch):
    monkeypatch.setattr(tp, "measured_rows", lambda *a, **k: None)
    p = TilePredictorPanel(gpus=("h200",))
    for cls in ("softmax", "layernorm", "elementwise", "gemm"):
        p.op_class.value = cls
        pts = [r for r in p.chart_data() if "op" in r]
        assert pts and {r["op_class"] for r in pts} == {cls}, cls  # was: GEMMs whatever the choice
        assert all(r["predicted_ms"] >= r["measured_ms"] for r in pts)
        assert _finite(pts)


def test_tile_panel_rejects_empty_rows():
    from kit.errors import KitError

    with pytest.raises(KitError, match="empty"):
        TilePredictorPanel(rows=_rows("l4", 0, 1.0))


# -- whole-model panel -----------------------------------------------------------------------
def test_whole_model_says_when_the_step_does_not_fit():
    from widgets.whole_model import WholeModelPanel

    # GPT-2 large: 774 M parameters x (4 B weights + 4 B gradients + 8 B AdamW) = 12.4 GB, 11.5 GiB
    p = WholeModelPanel(model="gpt2-large", gpu="p4", mode="train", batch=1, seq=128)
    s = p.summary.value
    # was: a step time and no warning; the P4 keeps 1/16 of its 8 GiB for in-band ECC
    assert "does not fit" in s and "p4 has 7.5 GiB usable (8 GiB" in s
    need_gib = float(s.split("needs about ")[1].split(" GiB")[0].replace(",", ""))
    assert need_gib > 16 * 774e6 / 2**30
    p.gpu.value = "a100-pcie-80gb"
    assert "does not fit" not in p.summary.value


def test_whole_model_seq_is_off_for_dlrm():
    from widgets.whole_model import WholeModelPanel

    p = WholeModelPanel(model="gpt2", gpu="a100-pcie-40gb", mode="inference", batch=1, seq=128)
    assert not p.seq.disabled
    p.model.value = "dlrm"  # DLRM has no sequence: the same step for every seq
    assert p.seq.disabled
    p.model.value = "bert-base"
    assert not p.seq.disabled


# -- embedding panel -------------------------------------------------------------------------
def test_embedding_backward_is_not_shown_as_a_zero_hit_rate():
    from widgets.embeddings import EmbeddingPanel

    p = EmbeddingPanel(rows=10**7, dim=128, pooling=30, batch=4096, alpha=1.0)
    hits = [r["value"] for r in p.chart_data() if r.get("what") == "hit_rate"]
    assert max(hits) > 0.5 and "L2 hit rate" in p.summary.value
    p.backward.value = True  # the backward kernel reads each unique row once: no lookup hit rate
    rows = p.chart_data()
    assert not [r for r in rows if r.get("what") == "hit_rate"]  # was: a flat line at 0
    assert [r for r in rows if r.get("what") == "unique_fraction"]
    assert "hit rate 0.0%" not in p.summary.value and "backward kernel" in p.summary.value
    assert "backward kernel time" in str(p.chart.to_dict())


# -- timeline panel --------------------------------------------------------------------------
def test_timeline_runs_on_every_system_of_its_dropdown():
    from widgets.timeline import TimelinePanel

    p = TimelinePanel(system="dgx-a100", dp=1, tp=2, pp=4, micro_batches=4)
    p.system.value = "dgx1-v100"  # V100 has no bf16: was "cannot run this layout" whatever the layout
    assert p._result is not None and "8 GPUs, fp16" in p.summary.value
    assert any(r.get("critical") for r in p.chart_data())
    p.system.value = "a100x4-nvlink"  # 8 GPUs on a 4-GPU box: was "...; add --nodes", a CLI flag
    assert p._result is None and "add --nodes" not in p.summary.value
    assert "= 8 GPUs, but a100x4-nvlink has 4: pick a smaller dp, tp or pp" in p.summary.value
    assert "pick a smaller" in p.chart_data()[0]["msg"]
    p.pp.value = 2  # 2 x 2 = 4 GPUs fit
    assert p._result is not None and "4 GPUs, bf16" in p.summary.value


def test_timeline_says_when_interleaving_rounds_the_micro_batches():
    from widgets.timeline import TimelinePanel

    p = TimelinePanel(system="dgx-a100", dp=1, tp=1, pp=4, micro_batches=8, schedule="interleaved")
    assert "micro-batches" not in p.summary.value.split("·")[0]
    p.m.value = 7  # interleaved needs a multiple of pp = 4: 7 - 7 % 4 = 4 are simulated
    assert p.layout().global_batch == 4
    assert "4 micro-batches (interleaved needs a multiple of pp)" in p.summary.value


# -- the notebooks as stored -----------------------------------------------------------------
def test_notebooks_are_stored_with_outputs_cleared():
    """The builders write cleared notebooks; stored outputs go stale (03 and 04 kept a run's
    outputs and widget views that no longer had a model behind them)."""
    import json
    from pathlib import Path

    folder = Path(__file__).resolve().parents[1] / "notebooks"
    books = sorted(folder.glob("[0-9][0-9]_*.ipynb"))
    assert len(books) >= 8
    for path in books:
        nb = json.loads(path.read_text(encoding="utf-8"))
        assert nb["metadata"]["kernelspec"]["name"] == "python3", path.name
        code = [c for c in nb["cells"] if c["cell_type"] == "code"]
        assert all(not c.get("outputs") and c.get("execution_count") is None for c in code), path.name


# -- GEMM panel and the waves chart ----------------------------------------------------------
def test_gemm_summary_of_a_single_tile_is_not_zero_percent_full():
    from widgets.gemm import GemmPanel

    p = GemmPanel(m=2, n=2, k=2, gpu="a100-sxm4-80gb")  # m or n of 1 is a gemv: no tiles
    s = p.summary.value  # 1 tile in 108 SMs x blocks/SM slots: 0.04%, was printed "0% full"
    assert s.startswith("1 tile of ") and "1 wave (last <1% full)" in s


def test_waves_chart_says_which_waves_it_leaves_out():
    from kit import viz
    from kit.hardware import get_gpu
    from kit.ops import Gemm
    from kit.tiling import SIMT_TILES, gemm_tiling_for

    t = gemm_tiling_for(Gemm(m=32768, n=32768, k=64), get_gpu("a100-sxm4-80gb"), SIMT_TILES[0])
    assert t.waves == -(-(256 * 256) // 216) == 304  # 128x128 tiles, 216 slots a wave
    chart = viz.waves_chart(t).to_dict()
    drawn = {r["wave"] for r in viz.waves_frame(t).to_dict("records")}
    assert drawn == set(range(1, viz.MAX_WAVE_BARS)) | {304}
    assert chart["title"] == f"65536 tiles of {t.tile} in 304 waves (waves 64-303 not drawn)"
    small = gemm_tiling_for(Gemm(m=128, n=128, k=64), get_gpu("a100-sxm4-80gb"), SIMT_TILES[0])
    assert viz.waves_chart(small).to_dict()["title"] == f"1 tile of {small.tile} in 1 wave"


def test_embedding_says_when_the_tables_exceed_the_gpu():
    from widgets.embeddings import EmbeddingPanel

    p = EmbeddingPanel(gpu="a100-sxm4-40gb", rows=10**7, dim=128)  # 10^7 x 128 x 4 B = 5.1 GB
    assert "more than" not in p.summary.value
    p.rows.value = 10**9  # 10^9 x 128 x 4 B = 512 GB = 477 GiB on a 40 GiB GPU
    assert "the tables hold 477 GiB, more than a100-sxm4-40gb's 40 GiB" in p.summary.value
    p.tables.value = 2
    assert "the tables hold 954 GiB" in p.summary.value


# -- collectives panel -----------------------------------------------------------------------
def test_collectives_size_axis_reads_in_binary_units():
    import re

    import vl_convert as vlc

    from widgets.collectives import CollectivesPanel

    p = CollectivesPanel(system="dgx-a100", collective="allreduce", ranks=8)
    texts = re.findall(r"<text[^>]*>([^<]*)</text>", vlc.vegalite_to_svg(p.chart.to_dict()))
    want = ["1 KiB", "4 KiB", "16 KiB", "64 KiB", "256 KiB", "1 MiB", "4 MiB", "16 MiB", "64 MiB",
            "256 MiB", "1 GiB", "4 GiB"]  # powers of 4 from 2^10 to 2^32
    assert texts[:len(want)] == want  # was 1.024k ... 1.073741824G
    assert not [t for t in texts if re.fullmatch(r"[\d.]+[kMG]", t)]
