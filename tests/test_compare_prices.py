"""compare()'s prices from Python: checked as --price-per-hour is, keyed as the GPU list is, and
before any GPU is predicted."""
import json
import math

import pytest

from kit.cli import main
from kit.cli.cmd_compare import compare
from kit.errors import KitError
from tests import test_compare_dtype

TINY_GPT = test_compare_dtype.TINY_GPT
_cache = test_compare_dtype._cache  # autouse: a fresh KIT_CACHE


@pytest.fixture
def predictions(monkeypatch):
    """How many GPUs compare predicted (iteration or generation calls)."""
    import kit.workload.generation as generation
    import kit.workload.iteration as iteration

    calls = []
    for module, name in ((iteration, "iteration"), (generation, "generation")):
        real = getattr(module, name)
        monkeypatch.setattr(module, name, lambda *a, _real=real, **k: calls.append(1) or _real(*a, **k))
    return calls


@pytest.mark.parametrize("mode", ["train", "generate"])
@pytest.mark.parametrize("price", [-2, float("nan"), math.inf, 1001, "2", True, None])
def test_a_bad_price_from_python_is_one_clear_error(price, mode, predictions):
    # -2 had given a cost of -0.145 $/M tokens, NaN and inf a NaN and inf cost, True a price of 1
    # and "2" a TypeError from the cost formula
    with pytest.raises(KitError, match="must be a number of dollars per GPU-hour"):
        compare(TINY_GPT, ["h100-sxm"], mode=mode, batch=1, seq=16, new_tokens=2, prices={"h100-sxm": price})
    assert predictions == []


@pytest.mark.parametrize("mode", ["train", "inference", "decode", "generate"])
def test_a_price_keyed_by_any_name_of_a_compared_gpu_prices_it(mode):
    # {"h100": 2} beside "h100-sxm" had been refused as "prices given for GPUs not compared: h100"
    r = compare(TINY_GPT, ["h100-sxm", "t4"], mode=mode, batch=1, seq=16, new_tokens=2,
                prices={"h100": 2, "NVIDIA T4": 0.5})
    rows = {row["gpu"]: row for row in r["rows"]}
    assert rows["h100-sxm"]["price_per_hour"] == 2 and rows["t4"]["price_per_hour"] == 0.5
    for row in rows.values():
        per_m = row["price_per_hour"] / 3600 * row["step_ms"] / 1e3 / (row["tokens_per_s"] * row["step_ms"] / 1e3) * 1e6
        assert row["cost_per_m_tokens"] == pytest.approx(per_m, rel=1e-12)


def test_two_names_of_one_gpu_priced_is_an_error():
    with pytest.raises(KitError, match="h100-sxm twice"):
        compare(TINY_GPT, ["h100-sxm"], mode="inference", batch=1, seq=16, prices={"h100": 2, "h100-sxm": 3})


@pytest.mark.parametrize("mode", ["train", "inference", "decode", "generate"])
def test_a_price_for_a_gpu_not_compared_is_refused_before_any_prediction(mode, predictions):
    # train, inference and decode had predicted every GPU first, then refused the price
    with pytest.raises(KitError, match="prices given for GPUs not compared: l4"):
        compare(TINY_GPT, ["h100-sxm", "t4"], mode=mode, batch=1, seq=16, new_tokens=2, prices={"l4": 1})
    assert predictions == []


def test_gpus_as_one_comma_string_are_the_gpus_it_names():
    # a str had been read letter by letter: "unknown GPU 'h'"
    r = compare(TINY_GPT, "h100-sxm,t4", mode="inference", batch=1, seq=16)
    assert [row["gpu"] for row in r["rows"]] == ["h100-sxm", "t4"]


def test_a_price_of_zero_costs_zero_and_minus_zero_is_zero(capsys, tmp_path):
    r = compare(TINY_GPT, ["h100-sxm"], mode="inference", batch=1, seq=16, prices={"h100-sxm": -0.0})
    row = r["rows"][0]
    assert row["price_per_hour"] == 0 and math.copysign(1, row["price_per_hour"]) == 1
    assert row["cost_per_m_tokens"] == 0 and math.copysign(1, row["cost_per_m_tokens"]) == 1
    config = tmp_path / "tiny.json"
    config.write_text(json.dumps(TINY_GPT))
    assert main(["compare", str(config), "--mode", "inference", "--batch", "1", "--seq", "16",
                 "--gpus", "h100-sxm", "--price-per-hour", "h100=0", "--json"]) == 0
    cli = json.loads(capsys.readouterr().out)["rows"][0]
    assert cli["price_per_hour"] == 0 and cli["cost_per_m_tokens"] == 0


@pytest.mark.parametrize("mode", ["inference", "generate"])
def test_a_gpu_object_of_its_own_key_is_priced_by_that_key(mode):
    # a GPU built with dataclasses.replace and a new key is in no catalog: its price, keyed by
    # that key, had been refused as "unknown GPU 'my-h100'" (check_prices looked it up there)
    import dataclasses

    from kit.hardware import get_gpu

    mine = dataclasses.replace(get_gpu("h100-sxm"), key="my-h100", name="My H100", aliases=())
    r = compare(TINY_GPT, [mine, "t4"], mode=mode, batch=1, seq=16, new_tokens=2, prices={"my-h100": 2})
    rows = {row["gpu"]: row for row in r["rows"]}
    assert rows["my-h100"]["price_per_hour"] == 2 and rows["my-h100"]["cost_per_m_tokens"] > 0
    assert rows["t4"]["price_per_hour"] is None
