"""The embedding and sharding panels: controls drive the chart data."""
import pytest

from widgets.embeddings import ALPHAS, EmbeddingPanel


def test_embedding_panel_skew_drives_hit_rate_and_time():
    p = EmbeddingPanel(rows=10**7, dim=64, pooling=20, batch=2048)
    rows = p.chart_data()
    hit = {r["alpha"]: r["value"] for r in rows if r.get("what") == "hit_rate"}
    time = {r["alpha"]: r["value"] for r in rows if r.get("part") == "time_ms"}
    assert set(hit) == set(ALPHAS)
    assert hit[1.6] > hit[1.0] > hit[0.0] and time[1.6] < time[0.0]
    before = p.summary.value
    p.alpha.value = 1.5
    assert p.summary.value != before and "hit rate" in p.summary.value
    # more tables running at once share the L2: the hit rate at the same skew falls
    p.tables.value = 16
    hit16 = {r["alpha"]: r["value"] for r in p.chart_data() if r.get("what") == "hit_rate"}
    assert hit16[1.0] < hit[1.0]


def test_sharding_panel_shows_per_rank_bars():
    pytest.importorskip("kit.comm")
    from widgets.sharding import ShardingPanel

    p = ShardingPanel(system="a100x4-nvlink", n_tables=6, budget_s=0.3)
    bars = [r for r in p.chart_data() if "rank" in r]
    assert {r["rank"] for r in bars} <= {0, 1, 2, 3} and len({r["table"] for r in bars}) == 6
    costs = {r["plan"]: r["cost_ms"] for r in p.chart_data() if "plan" in r}
    assert costs["search"] <= min(v for k, v in costs.items() if k != "search") + 1e-9
    p.plan.value = "greedy_size"
    assert any(r.get("shown") for r in p.chart_data() if r.get("plan") == "greedy_size")
    p.system.value = "dgx-a100"
    assert max(r["rank"] for r in p.chart_data() if "rank" in r) <= 7
    assert "dgx-a100" in p.summary.value
