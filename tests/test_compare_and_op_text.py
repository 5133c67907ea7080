"""kit compare's top-level memory in mode generate, and kit op's tiling line for a few tiles."""
import json

from kit.cli import main
from kit.cli.cmd_compare import compare
from kit.hardware import get_gpu
from tests.test_compare_dtype import TINY_GPT, _cache  # noqa: F401  (_cache: autouse, a fresh KIT_CACHE)


def test_a_generation_comparison_states_no_one_gpus_fit_at_the_top():
    # the top-level memory of a generate comparison had been the first GPU's generation memory,
    # with that GPU's size and fit ("gpu_memory_bytes" 16 GiB and "fits" of the t4) standing
    # for the whole table; the other modes state the need alone, and each row its own fit
    gen = compare(TINY_GPT, ["t4", "h100-sxm"], mode="generate", batch=1, seq=16, new_tokens=4)
    step = compare(TINY_GPT, ["t4", "h100-sxm"], mode="decode", batch=1, seq=16)
    assert set(gen["memory"]) == set(step["memory"])
    for row in gen["rows"]:
        assert row["fits"] == (gen["memory"]["total_bytes"] <= get_gpu(row["gpu"]).usable_memory_bytes)


def _op_text(capsys, *argv):
    assert main(["op", "gemm", *argv]) == 0
    text = capsys.readouterr().out
    assert main(["op", "gemm", *argv, "--json"]) == 0
    return next(ln for ln in text.splitlines() if ln.lstrip().startswith("tiling")), \
        json.loads(capsys.readouterr().out)


def test_kit_op_does_not_call_one_tile_zero_percent_full(capsys):
    # 1 tile of 128x128 in 132 SMs x 2 blocks = 264 slots is 0.4% of the wave: printed "0% full",
    # and "1 tiles ... 1 waves"; the GEMM panel's summary already said "<1%". (64 x 64 x 64 is
    # now a twin with more rows sets its time and tiling: the row bound, doubled_rows_ms)
    line, r = _op_text(capsys, "--m", "32", "--n", "16", "--k", "16", "--gpu", "h100-sxm")
    assert (r["tiles"], r["waves"]) == (1, 1) and 0 < r["last_wave_fill"] < 0.005
    assert "0% full" not in line.replace("<1% full", "") and "last wave <1% full" in line
    assert " 1 tile," in line and " 1 wave," in line
    line, r = _op_text(capsys, "--m", "4096", "--n", "4096", "--k", "4096", "--gpu", "h100-sxm")
    assert r["tiles"] > 1 and r["waves"] > 1
    assert f" {r['tiles']} tiles," in line and f" {r['waves']} waves," in line
    assert f"last wave {100 * r['last_wave_fill']:.0f}% full" in line
