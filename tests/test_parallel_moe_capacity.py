"""MoE expert capacity (Switch Transformer, Fedus et al.; GShard): with a capacity factor each
expert's buffer holds ceil(capacity_factor x tokens x topk / experts) rows, padded or dropped to
that, and the dispatch/combine all-to-alls and the expert GEMMs move those rows. Without one the
routing stays dropless and balanced (tokens x topk rows), as before."""
import math
import re
import warnings

import pytest

from kit.errors import KitError
from kit.parallel import GPTSpec, Layout, parse_model, predict_parallel
from kit.parallel.gpt import layer_forward
from kit.parallel.memory import activation_bytes_per_layer

# 6 experts: 256 tokens x top-2 = 512 rows do not split evenly, so capacity rounds up per expert
MOE = "moe:layers=2,hidden=512,heads=8,seq=256,experts=6,moe_every=1,topk=2"


def _expert_rows_and_alltoall_bytes(spec, ep=2):
    blocks = layer_forward(spec, 1, 1, ep, False, "fp16", layer=0)
    a2a = [b.comm[1] for b in blocks if b.comm and b.comm[0] == "alltoall"]
    experts = next(b for b in blocks if b.label.startswith("experts"))
    return experts.ops[0].m, a2a


@pytest.mark.parametrize("cf", [0.5, 1.0, 1.25, 2.0])
def test_capacity_sizes_the_expert_buffers_and_all_to_alls(cf):
    spec = parse_model(MOE + f",capacity_factor={cf}")
    rows = 6 * math.ceil(cf * 256 * 2 / 6)  # every expert's padded buffer
    got_rows, a2a = _expert_rows_and_alltoall_bytes(spec)
    assert got_rows == rows
    assert a2a == [rows * 512 * 2] * 2  # dispatch and combine, fp16


def test_no_capacity_factor_keeps_dropless_routing():
    spec = parse_model(MOE)
    assert spec.capacity_factor is None
    assert _expert_rows_and_alltoall_bytes(spec) == (256 * 2, [256 * 2 * 512 * 2] * 2)


def _ms(shape, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return predict_parallel(shape, "dgx-a100", Layout(dp=4, ep=2, micro_batch=1, **kw), graph=False)


def test_a_capacity_that_fits_balanced_routing_exactly_costs_what_dropless_does():
    # 8 experts: 256 x 2 / 8 = 64 rows an expert, so capacity factor 1 pads nothing
    shape = "moe:layers=2,hidden=512,heads=8,seq=256,experts=8,moe_every=1,topk=2"
    assert _ms(shape + ",capacity_factor=1")["iteration_ms"] == pytest.approx(_ms(shape)["iteration_ms"])


def test_more_capacity_costs_more_time_and_memory():
    runs = [_ms(MOE + f",capacity_factor={cf}") for cf in (1.0, 1.5, 2.5)]
    times = [r["iteration_ms"] for r in runs]
    assert times[0] < times[1] < times[2]
    acts = [r["memory_per_rank"][0]["activations_gib"] for r in runs]
    assert acts[0] < acts[1] < acts[2]
    # per layer the routed rows' activations (4h + 4f bytes a row: fc1's input, Korthikanti et al.'s 4f, and the
    # combine all-to-all's padded output that unpermute_with_padded_tokens multiplies by the probs) grow with the
    # capacity; 8 experts divide 256 x 2 rows, so at factor 1 they are dropless routing's
    shape, lay = "moe:layers=2,hidden=512,heads=8,seq=256,experts=8,moe_every=1,topk=2", Layout(micro_batch=1)
    a = {cf: activation_bytes_per_layer(parse_model(shape + (f",capacity_factor={cf}" if cf else "")), lay, 0)
         for cf in (None, 0.5, 1, 2)}
    assert a[1] == a[None]
    assert a[2] - a[1] == pytest.approx(512 * (4 * 512 + 4 * 2048))  # 512 more rows
    assert a[1] - a[0.5] == pytest.approx(256 * (4 * 512 + 4 * 2048))  # 256 more rows


@pytest.mark.parametrize("text, word", [(MOE + ",capacity_factor=0", "positive finite"),
                                        (MOE + ",capacity_factor=-1", "positive finite"),
                                        (MOE + ",capacity_factor=nan", "positive finite"),
                                        (MOE + ",capacity_factor=inf", "positive finite"),
                                        (MOE + ",capacity_factor=lots", "must be float"),
                                        ("gpt:layers=2,hidden=512,heads=8,capacity_factor=1.25",
                                         "applies to experts")])
def test_bad_capacity_factors_are_one_error(text, word):
    with pytest.raises(KitError, match=word):
        parse_model(text)


def test_a_dense_spec_with_a_capacity_factor_is_refused():
    with pytest.raises(KitError, match="applies to experts"):
        GPTSpec(layers=2, hidden=512, heads=8, capacity_factor=1.25)


def test_the_captured_graph_is_not_given_a_capacity_it_cannot_cost():
    import dataclasses

    zoo = next(m for m in ("mixtral-8x7b", "mixtral") if _resolves(m))
    spec = dataclasses.replace(parse_model(zoo), capacity_factor=1.25)
    with pytest.raises(KitError, match="capacity_factor 1.25 is costed on the analytic layer"):
        predict_parallel(spec, "dgx-h100", Layout(dp=8), graph=True)


def _resolves(name):
    try:
        return parse_model(name).experts > 0
    except KitError:
        return False


@pytest.mark.parametrize("cf", ["1e306", "1e300"])
def test_a_capacity_too_large_for_any_tensor_is_one_error(cf):
    # 1e306 x 256 tokens x top-2 overflowed to float inf and math.ceil raised OverflowError
    spec = parse_model(MOE + f",capacity_factor={cf}")
    with pytest.raises(KitError, match=re.escape(f"capacity_factor {float(cf)} gives each expert")):
        spec.routed_rows(256)
    with pytest.raises(KitError, match="capacity_factor"):
        _ms(MOE + f",capacity_factor={cf}")
