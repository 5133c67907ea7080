"""Panel polish: summaries describe what the chart shows, controls that do nothing say so, and
legends read in words with units. Each test failed on the panels before the fix."""
import numpy as np
import pandas as pd
import pytest


def _color_fields(node):
    """Every field a colour channel encodes, anywhere in the spec."""
    out = set()
    if isinstance(node, dict):
        color = node.get("encoding", {}).get("color") if isinstance(node.get("encoding"), dict) else None
        if isinstance(color, dict) and "field" in color:
            out.add(color["field"])
        for v in node.values():
            out |= _color_fields(v)
    elif isinstance(node, list):
        for v in node:
            out |= _color_fields(v)
    return out


def _colour_labels(panel):
    """What the colour legends list: the values of each colour-encoded field."""
    fields = _color_fields(panel.chart.to_dict())
    return {r[f] for r in panel.chart_data() for f in fields if f in r}


# 1. sharding ---------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def two_tables():
    pytest.importorskip("kit.comm")
    from widgets.sharding import ShardingPanel

    return ShardingPanel(system="dgx-a100", n_tables=2, budget_s=0.2)


def test_sharding_summary_describes_the_plan_shown(two_tables):
    p = two_tables
    p.plan.value = "search"
    searched = p.summary.value
    assert "baseline" not in searched.split(";")[0]
    p.plan.value = "greedy_size"  # was: the same text as for the searched plan
    text = p.summary.value
    assert text != searched and "greedy_size" in text.split("·")[0]
    cost = p.result()["baselines"]["greedy_size"]
    assert f"{cost:.3f} ms" in text.split("·")[0]
    p.plan.value = "search"
    assert p.summary.value == searched


def test_sharding_chart_has_every_rank_idle_ones_too(two_tables):
    p = two_tables
    world = p.result()["world_size"]
    p.plan.value = "greedy_size"  # table-wise: 2 tables on 8 ranks leave some ranks idle
    try:
        busy = {r["rank"] for r in p.chart_data() if "rank" in r}
        assert len(busy) < world
        bars = p.chart.to_dict()["hconcat"][0]
        assert bars["encoding"]["x"]["scale"]["domain"] == list(range(world))
    finally:
        p.plan.value = "search"


def test_sharding_legend_spells_out_the_kinds(two_tables):
    from kit.sharding import KINDS

    labels = _colour_labels(two_tables)
    assert labels and not labels & set(KINDS)  # was: tw, cw, ...
    assert any(label.startswith(("table-wise", "column-wise", "row-wise", "table-row-wise",
                                 "data-parallel")) for label in labels)


# 2. timeline ---------------------------------------------------------------------------------
def test_timeline_schedule_is_off_at_pp_1_and_back_on_above():
    from widgets.timeline import TimelinePanel

    p = TimelinePanel(system="dgx-a100", dp=1, tp=2, pp=1, micro_batches=4)
    assert p.schedule.disabled and "pp 1" in p.schedule.tooltip  # was: enabled, silently ignored
    p.pp.value = 2
    assert not p.schedule.disabled
    p.pp.value = 1
    assert p.schedule.disabled
    assert not TimelinePanel(system="dgx-a100", dp=1, tp=2, pp=4, micro_batches=8).schedule.disabled


# 3. gemm ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("gpu, dtype, missing", [
    ("a100-sxm4-80gb", "bf16", "v100-sxm2-32gb"),
    ("a100-sxm4-80gb", "tf32", "v100-sxm2-32gb"),
    ("h100-sxm", "fp8", "a100-sxm4-80gb"),
])
def test_gemm_says_which_compared_gpus_the_roofline_leaves_out(gpu, dtype, missing):
    from widgets.gemm import GemmPanel

    p = GemmPanel(m=2048, n=2048, k=2048, gpu=gpu, dtype=dtype,
                  compare=("v100-sxm2-32gb", "a100-sxm4-80gb", "h100-sxm"))
    drawn = {r["gpu"] for r in p.chart_data() if "gpu" in r}
    assert missing not in drawn and gpu in drawn
    assert missing in p.summary.value and dtype in p.summary.value  # was: not a word
    roof = p.chart.to_dict()["hconcat"][1]
    assert missing in roof["title"]["subtitle"]


def test_gemm_says_nothing_when_every_gpu_is_drawn():
    from widgets.gemm import GemmPanel

    p = GemmPanel(dtype="fp16")
    assert "left off" not in p.summary.value
    assert isinstance(p.chart.to_dict()["hconcat"][1]["title"], str)


# 4. chart labels -------------------------------------------------------------------------------
RAW_EMBEDDING_FIELDS = {"hit_rate", "unique_fraction", "time_ms", "dram_ms", "l2_ms"}


@pytest.mark.parametrize("backward", [False, True])
def test_embedding_legends_read_in_words_with_units(backward):
    from widgets.embeddings import EmbeddingPanel

    p = EmbeddingPanel(rows=10**6, dim=64, pooling=10, batch=1024, backward=backward)
    labels = _colour_labels(p)
    assert labels and not labels & RAW_EMBEDDING_FIELDS  # was: the raw field names
    assert {"kernel time (ms)", "DRAM traffic time (ms)", "L2 traffic time (ms)"} <= labels
    assert ("L2 hit rate (fraction of lookups)" in labels) != backward


def _rows():
    rng = np.random.default_rng(0)
    frames = []
    for op, cls in (("bmm", "gemm"), ("addu", "elementwise"), ("ln", "layernorm")):
        measured = 10 ** rng.uniform(-2, 1, 10)
        frames.append(pd.DataFrame({"gpu": "l4", "op": op, "op_class": cls, "measured_ms": measured,
                                    "predicted_ms": measured * 1.1, "p10_ms": measured,
                                    "p90_ms": measured * 1.2, "ape": 10.0, "tile": "128x64"}))
    return pd.concat(frames, ignore_index=True)


def test_tile_predictor_legend_names_the_ops():
    from widgets.tile_predictor import TilePredictorPanel

    p = TilePredictorPanel(rows=_rows())
    labels = _colour_labels(p)
    assert labels == {"batched matmul", "add a scalar", "layer norm"}  # was: bmm, addu, ln


def test_collectives_charts_have_titles():
    from widgets.collectives import CollectivesPanel

    p = CollectivesPanel(system="dgx-a100", collective="allreduce", ranks=8)
    charts = p.chart.to_dict()["hconcat"]
    titles = [c.get("title") for c in charts]
    assert all(titles)  # was: none
    assert all("8 ranks" in t and "dgx-a100" in t for t in titles)
    assert "time" in titles[0] and "bandwidth" in titles[1]
