"""GDDR cards with ECC on by default keep 1/16 of their memory for the check bits (in-band):
nvidia-smi shows a T4 at 15,360 MiB of 16,384. The kit's fit checks hold a step against what is
left; HBM cards (sideband ECC) and GeForce cards (no ECC) keep their whole size."""
import json
from types import SimpleNamespace

import pytest

from kit.errors import KitError
from kit.hardware import get_gpu, list_gpus
from kit.hardware.gpu import gpu_from_dict

GIB = 2**30
ECC_IN_BAND = {"p4", "t4", "a10", "a40", "l4", "l40", "l40s"}  # GDDR, data-center: ECC on
SIDEBAND_HBM = {"p100-pcie-16gb", "p100-sxm2-16gb", "v100-pcie-16gb", "v100-pcie-32gb",
                "v100-sxm2-16gb", "v100-sxm2-32gb", "a100-pcie-40gb", "a100-sxm4-40gb",
                "a100-pcie-80gb", "a100-sxm4-80gb", "a30", "h100-pcie", "h100-sxm", "h100-nvl",
                "h200", "gh200", "b200", "mi100", "mi210", "mi250", "mi250x", "mi300x"}
NO_ECC_BY_DEFAULT = {"rtx-2080-ti", "rtx-3090", "rtx-4090", "rtx-a6000"}  # A6000: ECC ships off


def test_every_catalog_gpu_is_classed_and_only_in_band_ecc_loses_memory():
    keys = {g.key for g in list_gpus()}
    # a GPU added to the catalog must be put in one of the three: its memory type decides
    assert keys == ECC_IN_BAND | SIDEBAND_HBM | NO_ECC_BY_DEFAULT
    for g in list_gpus():
        lost = g.memory_bytes - g.usable_memory_bytes
        assert lost == (g.memory_bytes / 16 if g.key in ECC_IN_BAND else 0), g.key
        if g.key in ECC_IN_BAND:
            assert "ECC" in g.source  # the field cites where it comes from
    # nvidia-smi's total on a T4 with ECC on, in MiB
    assert get_gpu("t4").usable_memory_bytes / 2**20 == 15360


def _step(need_bytes):
    return SimpleNamespace(meta={"param_bytes": int(need_bytes), "mode": "inference"})


@pytest.mark.parametrize("share", [15.01 / 16, 15.5 / 16, 15.99 / 16])
def test_a_step_between_15_and_16_sixteenths_of_a_t4_does_not_fit(share):
    from kit.cli.cmd_compare import gpu_row
    from kit.workload.models import memory_bytes, memory_fit

    t4 = get_gpu("t4")
    need = share * t4.memory_bytes
    fit = memory_fit(_step(need), "t4")
    assert not fit["fits"] and fit["gpu_usable_memory_bytes"] < need <= fit["gpu_memory_bytes"]
    # the same need on a 16 GiB HBM card fits: it is the ECC carve-out, not the size
    assert memory_fit(_step(need), "v100-pcie-16gb")["fits"]
    row = gpu_row(t4, 10.0, [9.0, 11.0], 1, "samples", memory_bytes(_step(need)), {"t4": 0.35}, "x")
    assert row["fits"] is False and row["cost_per_m_samples"] is None
    assert row["memory_gib"] == 16 and row["usable_memory_gib"] == 15
    # and just under 15/16 still fits
    assert memory_fit(_step(0.999 * t4.usable_memory_bytes), "t4")["fits"]


def test_max_batch_and_tables_are_held_against_the_usable_memory():
    from kit import ops
    from kit.api import memory_problem
    from kit.workload.models import max_batch

    t4 = get_gpu("t4")
    mem = {"weights_bytes": 14 * GIB, "buffers_bytes": 0, "kv_cache_bytes": 0.25 * GIB,
           "activations_bytes": 0.25 * GIB}
    n = max_batch(mem, 1, t4.usable_memory_bytes)
    assert 14 + 0.5 * n <= 15 < 14 + 0.5 * (n + 1)  # 2 sequences, not the 4 of 16 GiB
    table = ops.EmbeddingBag(1, int(15.5 * GIB / (4 * 128)), 128, 1, "fp32")
    why = memory_problem(table, "t4")
    assert why and "15 GiB usable" in why and "ECC" in why
    assert memory_problem(table, "v100-pcie-16gb") is None


def test_a_user_gpu_without_the_field_keeps_all_and_a_percent_is_refused():
    entry = get_gpu("t4").to_dict()
    entry.pop("ecc_reserved_fraction")
    plain = gpu_from_dict(json.loads(json.dumps(entry)))
    assert plain.usable_memory_bytes == plain.memory_bytes
    for bad in (6.25, -0.1, True, "1/16", float("nan")):
        with pytest.raises(KitError, match="ecc_reserved_fraction"):
            gpu_from_dict({**entry, "ecc_reserved_fraction": bad})


def test_kit_gpus_shows_the_advertised_size_and_the_usable_beside_it():
    from kit.cli.cmd_gpus import text

    lines = text([g.to_dict() for g in list_gpus()]).splitlines()
    head = lines[0].split()
    t4 = next(ln.split() for ln in lines if ln.startswith("t4 "))
    h100 = next(ln.split() for ln in lines if ln.startswith("h100-sxm "))
    assert t4[head.index("GiB")] == "16" and t4[head.index("usable")] == "15"
    assert h100[head.index("GiB")] == h100[head.index("usable")] == "80"


# ---------------------------------------------------------------------------------------------
# each fit check the commit moved to the usable memory, held to it at its own call site: with
# any one of them back on the advertised size (memory_bytes), one of these fails
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("mode, kw", [("decode", {"seq": 1023}), ("generate", {"seq": 512, "new_tokens": 4})])
def test_compare_max_batch_fills_the_usable_memory_not_the_advertised(mode, kw):
    """kit compare's max batch on a T4 is the largest whose need fits in 15 GiB (gpt2 fp32
    decode at context 1,023: 190 sequences; held against 16 GiB it had been 203)."""
    from kit.cli.cmd_compare import compare

    r = compare("gpt2", ["t4"], mode=mode, batch=1, **kw)
    m, n = r["memory"], r["rows"][0]["max_batch"]
    fixed = m["weights_bytes"] + m["buffers_bytes"]
    per = m["kv_cache_bytes"] + m["activations_bytes"]  # a sequence's, at batch 1
    t4 = get_gpu("t4")
    assert n >= 1 and fixed + n * per <= t4.usable_memory_bytes < fixed + (n + 1) * per


def test_megatron_memory_rows_fit_against_the_usable_memory():
    """A stage between 15/16 and the whole of a GDDR card's size does not fit; on an HBM card of
    that size it does."""
    import dataclasses

    from kit.parallel import GPTSpec, Layout, memory_per_rank

    spec = GPTSpec(layers=4, hidden=1024, heads=16, seq=512, vocab=32000, name="ecc")
    lay = Layout(tp=1, micro_batch=2, dtype="fp16")
    total = max(r["total_gib"] for r in memory_per_rank(spec, lay))
    size = total / (1 - 0.5 / 16)  # the stage needs 31/32 of it: more than 15/16
    gddr = dataclasses.replace(get_gpu("l40s"), memory_gib=size)
    hbm = dataclasses.replace(get_gpu("h100-sxm"), memory_gib=size)
    rows = memory_per_rank(spec, lay, gddr)
    assert not any(r["fits"] for r in rows if r["total_gib"] == total)
    assert all(r["gpu_usable_memory_gib"] == pytest.approx(size * 15 / 16) for r in rows)
    assert all(r["fits"] for r in memory_per_rank(spec, lay, hbm))


class _T4System:
    """Four T4s on one node, for the sharding caps (the stand-in of tests/sharding_support.py
    with a GDDR card)."""

    def __init__(self, world=4):
        self.world_size, self.gpus_per_node, self.key, self.gpu = world, world, "t4x4", get_gpu("t4")

    def node_of(self, r):
        return r // self.gpus_per_node


def test_sharding_caps_are_held_against_the_usable_memory():
    from kit.embedding import Table
    from kit.parallel.dlrm import sharding_model
    from kit.sharding import ShardingModel, plan_sharding
    from sharding_support import StandInComm

    tabs = [Table(rows=1000, dim=64, pooling=4, name="a")]
    t4 = get_gpu("t4")
    # the default cap is 90% of what a T4 can hold (13.5 GiB), not of its 16 (14.4)
    model = ShardingModel(tabs, _T4System(), comm=StandInComm())
    assert model.cap <= 0.9 * t4.usable_memory_bytes * (1 + 1e-12) and model.cap > 0.89 * t4.usable_memory_bytes
    # a cap of 15.5 GiB is more than a T4 holds with its ECC on: refused, naming the usable 15
    for call in (lambda: plan_sharding(tabs, _T4System(), memory_cap_gib=15.5, comm=StandInComm()),
                 lambda: sharding_model(tabs, _T4System(), 512, memory_cap_gib=15.5)):
        with pytest.raises(KitError, match="15 GiB usable"):
            call()
    r = plan_sharding(tabs, _T4System(), memory_cap_gib=14.9, comm=StandInComm(), time_budget_s=0.2)
    assert r["memory_cap_gib"] == pytest.approx(14.9)


def test_an_operand_set_between_15_and_16_gib_is_no_kernel_on_a_t4():
    from kit import ops
    from kit.api import memory_problem

    n = 37_000  # fp32 A, B and C of 37,000 x 37,000: 15.3 GiB moved
    op = ops.Gemm(n, n, n, dtype="fp32", kind="mm")
    t4 = get_gpu("t4")
    assert t4.usable_memory_bytes < op.bytes <= t4.memory_bytes
    why = memory_problem(op, "t4")
    assert why and "no such kernel" in why and "15 GiB usable" in why
    assert memory_problem(op, "v100-pcie-16gb") is None


def test_kit_gpus_json_loads_back_as_a_gpu_file_keeping_the_ecc_share(tmp_path):
    """`kit gpus --json` writes every field; loaded back under new keys (a --gpu-file) each GPU
    keeps its usable memory: a T4 copy holds 15 GiB, an H100 copy 80."""
    from kit.cli.cmd_gpus import run
    from kit.hardware import load_gpu_file, unregister_gpu

    out = run(SimpleNamespace(add=None))
    copies = [{**g, "key": f"copy-{g['key']}", "name": f"Copy {g['name']}", "aliases": []} for g in out]
    f = tmp_path / "gpus.json"
    f.write_text(json.dumps(copies))
    try:
        loaded = {g.key: g for g in load_gpu_file(f)}
        for g in list_gpus():
            if g.key.startswith("copy-"):
                continue
            c = loaded[f"copy-{g.key}"]
            assert c.ecc_reserved_fraction == g.ecc_reserved_fraction, g.key
            assert c.usable_memory_bytes == g.usable_memory_bytes, g.key
        assert loaded["copy-t4"].usable_memory_gib == 15 and loaded["copy-h100-sxm"].usable_memory_gib == 80
    finally:
        for c in copies:
            unregister_gpu(c["key"])
