"""--budget-s is the plan search's, and the cost model's setup comes on top, said in the output
where it alone took longer: 2 tables on dgx-a100 --nodes 64 (512 GPUs) spend seconds building the
cost model, and charging it to the default 2 s had left the search its starting plans only (and
a first call's scipy import had made the wall clock bind, so the plan hung on the machine's
load). A round of single-table moves on a cluster (T x O plans of ~14 W features) had run to its
end past the deadline. Fake clocks stand for a slow setup and a late round: no timed test."""
import numpy as np
import pytest
from sharding_support import StandInComm, StandInSystem

import kit.sharding.model as model
import kit.sharding.planner as planner
import kit.sharding.search as search
from kit.cli.cmd_shard import text
from kit.embedding import Table, Zipf
from kit.errors import KitError
from kit.hardware import get_system
from kit.sharding import ShardingModel, local_search, plan_sharding


def _tables(n=12, seed=5):
    rng = np.random.default_rng(seed)
    return [Table(rows=int(10 ** rng.uniform(4, 7)), dim=int(rng.choice([32, 64, 128])),
                  pooling=float(rng.integers(1, 40)), name=f"t{i}",
                  distribution=Zipf(float(rng.uniform(0.5, 1.2)))) for i in range(n)]


class _Clock:
    """perf_counter: `early` readings at 0, then every reading 10 s after the last."""

    def __init__(self, early=0):
        self.early, self.t = early, 0.0

    def perf_counter(self):
        if self.early:
            self.early -= 1
        else:
            self.t += 10.0
        return self.t


STARTS = 3 + 4 + 3  # the plans a search prices first, at most: 3 greedy, 4 uniform kinds, 3 random


def test_a_setup_past_the_budget_leaves_the_search_its_budget_and_says_why(monkeypatch):
    idle = plan_sharding(_tables(), StandInSystem(8, 8), batch=512, comm=StandInComm(), time_budget_s=2.0)
    monkeypatch.setattr(planner, "time", _Clock())  # the cost model and the baselines take 10 s each
    r = plan_sharding(_tables(), StandInSystem(8, 8), batch=512, comm=StandInComm(), time_budget_s=2.0)
    # charged to the budget, the setup had left the search its starts (<= 10 plans) and a plan of
    # the machine's speed; the search's own clock is real here, and its 2 s stand for 300,000 plans
    assert r["search_stopped_by"] != "time budget" and r["plans_evaluated"] > 100 * STARTS
    assert (r["plan"], r["cost_ms"], r["plans_evaluated"]) == (idle["plan"], idle["cost_ms"], idle["plans_evaluated"])
    assert r["setup_over_budget"] and r["setup_s"] >= 10 and not idle["setup_over_budget"]
    assert r["cost_model_size"]["placements"] == sum(len(o) for o in ShardingModel(
        _tables(), StandInSystem(8, 8), batch=512, comm=StandInComm()).options)
    out = text(r)
    note = next(x for x in out.splitlines() if "budget:" in x)
    assert "building the cost model" in note and "GPUs squared" in note and "--budget-s 2" in note
    assert "does not cap it" in note and "--nodes" in note
    assert not any("budget:" in x for x in text(idle).splitlines())


def test_a_round_of_moves_stops_at_the_deadline_between_batches(monkeypatch):
    m = ShardingModel(_tables(), StandInSystem(8, 8), batch=512, comm=StandInComm())
    per_batch = 10
    monkeypatch.setattr(search, "MOVE_CHUNK_VALUES", per_batch * m.F, raising=False)
    # the deadline's reading and the first move's check come early; every later one is late
    monkeypatch.setattr(search, "time", _Clock(early=2))
    found = local_search(m, time_budget_s=1.0, max_plans=10**9)
    round_of_moves = int(m.valid.sum())
    assert round_of_moves > 20 * per_batch
    assert found.stopped_by == "time budget"
    # the starts, and the round's first batch: not the whole round
    assert found[2] <= STARTS + per_batch


def test_batched_moves_give_the_same_search_bit_for_bit(monkeypatch):
    m = ShardingModel(_tables(), StandInSystem(8, 8), batch=512, comm=StandInComm())
    whole = local_search(m, time_budget_s=600.0, max_plans=20_000)
    monkeypatch.setattr(search, "MOVE_CHUNK_VALUES", 7 * m.F)
    batched = local_search(m, time_budget_s=600.0, max_plans=20_000)
    assert np.array_equal(whole[0], batched[0]) and whole[1] == batched[1] and whole[2] == batched[2]


def test_a_cluster_past_the_machine_s_free_memory_is_refused_before_it_is_built(monkeypatch):
    """The cost model's limit was a fixed 8 GiB: on a machine with less free, 2 tables on
    2,048 GPUs (~7 GiB) ran into the OOM killer minutes into the setup."""
    t = [Table(rows=10**6, dim=64, pooling=8, name="t"), Table(rows=10**5, dim=128, pooling=2, name="u")]
    W = 128  # dgx-a100 x16; placements a table: 128 tw + 2 x 128 cw + rw + 16 twrw + dp = 402
    need_gib = 2 * 402 * (14 * W + 1) * model.MODEL_BYTES_PER_FEATURE / 2**30  # ~0.027 GiB
    monkeypatch.setattr(model, "available_memory_bytes", lambda: 0.5 * need_gib * 2**30, raising=False)
    with pytest.raises(KitError, match="this machine has free") as e:
        ShardingModel(t, get_system("dgx-a100-x16"))
    assert f"{need_gib:.3g} GiB" in str(e.value) and "--nodes" in str(e.value)
    monkeypatch.setattr(model, "available_memory_bytes", lambda: 2 * need_gib * 2**30)
    assert ShardingModel(t, get_system("dgx-a100-x16")).contrib.shape == (2, 402, 6 * W + 8 * W + 1)


def _memory(monkeypatch, tmp_path, meminfo_kb=None, cgroup=None):
    if meminfo_kb is not None:
        (tmp_path / "meminfo").write_text(f"MemTotal: 99999999 kB\nMemAvailable: {meminfo_kb} kB\n")
    if cgroup is not None:
        (tmp_path / "memory.max").write_text(f"{cgroup[0]}\n")
        (tmp_path / "memory.current").write_text(f"{cgroup[1]}\n")
    monkeypatch.setattr(model, "MEMINFO", str(tmp_path / "meminfo"), raising=False)
    monkeypatch.setattr(model, "CGROUP_LIMITS", ((str(tmp_path / "memory.max"), str(tmp_path / "memory.current")),),
                        raising=False)
    return model.available_memory_bytes()


def test_free_memory_is_linux_s_memavailable_or_a_container_s_headroom(monkeypatch, tmp_path):
    assert _memory(monkeypatch, tmp_path, meminfo_kb=2048) == 2048 * 1024
    # a container of 3 GiB with 1 GiB in use has 2 GiB, whatever the host's MemAvailable says
    # (MemAvailable had been read alone: the OOM killer acts at the container's limit)
    assert _memory(monkeypatch, tmp_path, meminfo_kb=64 * 2**20, cgroup=(3 * 2**30, 2**30)) == 2 * 2**30
    assert _memory(monkeypatch, tmp_path, meminfo_kb=2048, cgroup=(3 * 2**30, 2**30)) == 2048 * 1024
    assert _memory(monkeypatch, tmp_path, meminfo_kb=2048, cgroup=("max", 2**30)) == 2048 * 1024  # no limit


def test_free_memory_without_proc_is_the_physical_memory(monkeypatch, tmp_path):
    """macOS has no /proc/meminfo: the guard had fallen back to its fixed 8 GiB alone."""
    os = pytest.importorskip("os")
    if not hasattr(os, "sysconf") or "SC_PHYS_PAGES" not in os.sysconf_names:
        pytest.skip("no sysconf here")
    assert _memory(monkeypatch, tmp_path) == os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def test_a_cluster_stopped_by_the_clock_does_not_blame_the_machine():
    """PLANS_PER_S was measured up to 32 GPUs; a plan of 1,024 is ~14,000 features, and the
    default 2 s stopped 2 tables on dgx-a100 --nodes 128 at 59,398 of 300,000 plans on the shared
    box, where the text said "this machine is slow or busy"."""
    r = {"search_stopped_by": "time budget", "time_budget_s": 2.0, "max_plans": 300_000,
         "max_plans_given": False, "world_size": 1024, "plans_evaluated": 59_398,
         "cost_model_size": {"placements": 6404, "features": 14 * 1024 + 1}}
    from kit.cli.cmd_shard import search_end

    end = search_end(r, "--budget-s")
    assert "slow or busy" not in end and "14,337 features" in end and "1,024 GPUs" in end
    r.update(world_size=32, cost_model_size={"placements": 300, "features": 14 * 32 + 1})
    assert "slow or busy" in search_end(r, "--budget-s")  # at the sizes PLANS_PER_S was measured at


def test_the_panel_says_what_the_cli_says_of_a_cluster_stopped_by_the_clock():
    """widgets.sharding's summary had its own wording, "this machine is busy", for every search
    the clock stopped: a 1,024-GPU plan's too (cut by its size, as the CLI says since da35d61)."""
    from types import SimpleNamespace

    from kit.sharding.search import PLANS_PER_S_MAX_WORLD
    from widgets.sharding import ShardingPanel

    parts = {k: 0.0 for k in ("input_alltoall_ms", "output_alltoall_ms", "grad_alltoall_ms")}
    r = {"search_stopped_by": "time budget", "time_budget_s": 2.0, "max_plans": 300_000,
         "max_plans_given": False, "world_size": 1024, "plans_evaluated": 59_398,
         "cost_model_size": {"placements": 6404, "features": 14 * 1024 + 1},
         "plan": [{}, {}], "system": "dgx-a100", "cost_ms": 1.0, "imbalance": 1.0, "parts": parts,
         "best_baseline": None, "baselines": {}}
    panel = SimpleNamespace(result=lambda: r, plan=SimpleNamespace(value="search"))
    said = ShardingPanel.summary_text(panel)
    assert "busy" not in said and "1,024 GPUs" in said and "14,337 features" in said
    assert f"measured up to {PLANS_PER_S_MAX_WORLD} GPUs" in said
    assert "--max-plans" not in said and "budget_s 2" in said  # the panel's own budget, by name
    r.update(world_size=32, cost_model_size={"placements": 300, "features": 14 * 32 + 1})
    assert "slow or busy" in ShardingPanel.summary_text(panel)  # where PLANS_PER_S was measured
