"""kit compare over GPUs of which some lack the dtype: those get a row that says so, the rest
still compare; only when none can run it is it one error."""
import json

import pytest

from kit.cli import main
from kit.cli.cmd_compare import compare
from kit.errors import KitError

TINY_GPT = {"model_type": "gpt2", "n_embd": 64, "n_head": 2, "n_layer": 1, "n_positions": 64,
            "vocab_size": 128}


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("KIT_CACHE", str(tmp_path / "cache"))


def test_a_gpu_without_the_dtype_gets_a_row_not_an_abort():
    r = compare(TINY_GPT, ["a100-pcie-80gb", "t4"], mode="inference", batch=2, seq=16,
                dtype="bf16", prices={"t4": 0.35})
    rows = {row["gpu"]: row for row in r["rows"]}
    assert rows["a100-pcie-80gb"]["unsupported"] is None and rows["a100-pcie-80gb"]["step_ms"] > 0
    t4 = rows["t4"]
    assert "no bf16 support" in t4["unsupported"] and "fp16" in t4["unsupported"]
    assert t4["step_ms"] is None and t4["tokens_per_s"] is None and t4["cost_per_m_tokens"] is None
    assert t4["price_per_hour"] == 0.35 and t4["fits"] is None  # unknown: it cannot run the dtype
    # the supported row is what comparing it alone gives
    alone = compare(TINY_GPT, ["a100-pcie-80gb"], mode="inference", batch=2, seq=16, dtype="bf16")
    assert alone["rows"][0]["step_ms"] == rows["a100-pcie-80gb"]["step_ms"]


def test_none_supporting_the_dtype_is_one_error(capsys):
    with pytest.raises(KitError, match="none of p100-pcie-16gb, t4 supports bf16"):
        compare(TINY_GPT, ["p100-pcie-16gb", "t4"], mode="inference", batch=1, seq=16, dtype="bf16")
    rc = main(["compare", "gpt2", "--gpus", "p100-pcie-16gb,t4", "--dtype", "bf16", "--seq", "16"])
    assert rc == 2 and "supports bf16" in capsys.readouterr().err


def test_cli_text_and_json_show_the_unsupported_row(capsys):
    rc = main(["compare", "gpt2", "--gpus", "a100-pcie-80gb,t4", "--dtype", "bf16", "--seq", "32",
               "--mode", "inference"])
    out = capsys.readouterr().out
    assert rc == 0
    t4_line = next(line for line in out.splitlines() if line.startswith("t4 "))
    assert "no bf16 support" in t4_line
    rc = main(["compare", "gpt2", "--gpus", "a100-pcie-80gb,t4", "--dtype", "bf16", "--seq", "32",
               "--mode", "inference", "--json"])
    rows = json.loads(capsys.readouterr().out)["rows"]
    assert rc == 0 and [row["unsupported"] is None for row in rows] == [True, False]


def test_a_step_that_does_not_fit_gets_a_time_but_no_cost(capsys):
    # the cost per million tokens was printed for a step that needs more memory than the GPU has
    import json

    from kit.cli import main

    assert main(["compare", "gpt2", "--gpus", "p4,h100-sxm", "--batch", "8", "--seq", "1024",
                 "--price-per-hour", "p4=1,h100-sxm=1", "--json"]) == 0
    rows = {r["gpu"]: r for r in json.loads(capsys.readouterr().out)["rows"]}
    p4, h100 = rows["p4"], rows["h100-sxm"]
    assert not p4["fits"] and p4["step_ms"] > 0 and p4["cost_per_m_tokens"] is None
    assert h100["fits"] and h100["cost_per_m_tokens"] == pytest.approx(
        1 / 3600 * h100["step_ms"] / 1e3 / (8 * 1024) * 1e6)
    assert main(["compare", "gpt2", "--gpus", "p4,h100-sxm", "--batch", "8", "--seq", "1024",
                 "--price-per-hour", "p4=1,h100-sxm=1"]) == 0
    assert "fits NO" in capsys.readouterr().out
