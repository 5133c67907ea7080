"""The model states a Megatron training rank holds (kit.parallel.memory): bytes a parameter as
Megatron-LM's own docs count them, and which parameters TP leaves whole on every rank.

Expectations come from Megatron-LM's docs/source/api-guide/dist_optimizer.md (its table of bytes
a parameter, with and without the distributed optimizer) and from the layer's structure, not from
the kit's output.
"""
import pytest

from kit.parallel import GPTSpec, Layout, memory_per_rank, parse_model
from kit.parallel.memory import local_expert_params, local_params

GIB = 2**30
SPEC = GPTSpec(layers=6, hidden=1024, heads=16, seq=512, vocab=32000, name="state")


# Megatron-LM dist_optimizer.md: (param dtype, grad dtype) -> (non-distributed bytes a parameter,
# distributed: bytes kept whole, bytes divided by the d data-parallel ranks)
MEGATRON_TABLE = {("fp16", "fp16"): (20, 4, 16), ("bf16", "fp32"): (18, 6, 12),
                  ("fp32", "fp32"): (16, 8, 8)}


@pytest.mark.parametrize("dtypes", sorted(MEGATRON_TABLE))
def test_model_states_are_megatrons_bytes_a_parameter(dtypes):
    """Megatron's fp16 run holds 20 B a parameter (the optimizer's fp32 copy of the fp16
    gradients besides fp32 master weights, momentum and variance), 4 + 16/d with its distributed
    optimizer, which the kit's ZeRO-1 is; the ZeRO paper's 16 (2 + 2 + 12) had been counted."""
    dtype, grad_dtype = dtypes
    plain, whole, split = MEGATRON_TABLE[dtypes]
    d = 8
    for zero, expect in ((0, plain), (1, whole + split / d)):
        lay = Layout(dp=d, pp=1, micro_batch=1, global_batch=d, dtype=dtype, grad_dtype=grad_dtype,
                     zero=zero)
        row = memory_per_rank(SPEC, lay)[0]
        states = (row["weights_gib"] + row["grads_gib"] + row["optimizer_gib"]) * GIB
        assert states == pytest.approx(expect * row["params"], rel=1e-12)
    # fp16 weights with fp32 gradients: Megatron's main_grad is already fp32, no copy (2 + 4 + 12)
    row = memory_per_rank(SPEC, Layout(dtype="fp16", grad_dtype="fp32"))[0]
    assert (row["weights_gib"] + row["grads_gib"] + row["optimizer_gib"]) * GIB == pytest.approx(
        18 * row["params"], rel=1e-12)


def test_norms_row_parallel_biases_and_the_router_stay_whole_on_every_tp_rank():
    """Summed over its t TP ranks a layer holds its parameters once plus t - 1 more copies of
    what TP does not split: two norms (4h), the out projection's and the second MLP's biases
    (added after the row-parallel all-reduce, 2h); in a MoE layer the router (E x h) and each
    expert's second bias in place of the MLP's. They had been divided by t like the weights."""
    h, t = SPEC.hidden, 4
    lay = Layout(tp=t, pp=3, micro_batch=1, global_batch=1)
    per_stage = SPEC.layers // 3  # the middle stage holds layers only: no embedding, no head
    assert local_params(SPEC, lay, 1) * t == pytest.approx(
        per_stage * (SPEC.layer_params(0) + (t - 1) * 6 * h), rel=1e-12)
    assert local_params(SPEC, lay.with_(tp=1), 1) == per_stage * SPEC.layer_params(0)

    experts, ep = 8, 2
    moe = parse_model(f"moe:layers=3,hidden={h},heads=16,seq=512,experts={experts},moe_every=1,topk=2")
    lay = Layout(tp=t, dp=ep, ep=ep, pp=3, micro_batch=1, global_batch=ep)
    expert_params = experts * (2 * h * moe.f + moe.f + h)  # each expert's MLP and its two biases
    # over the t x ep ranks of a stage: each expert once on its t TP ranks, its second bias whole
    assert local_expert_params(moe, lay, 1) * t * ep == pytest.approx(
        expert_params + (t - 1) * experts * h, rel=1e-12)
    dense = moe.layer_params(1) - expert_params
    kept = 4 * h + h + experts * h  # norms, out projection's bias, router
    assert (local_params(moe, lay, 1) - local_expert_params(moe, lay, 1)) * t == pytest.approx(
        dense + (t - 1) * kept, rel=1e-12)


def test_a_new_dtype_brings_its_own_default_gradient_dtype_and_bucket():
    """Layout fills grad_dtype (and the 40M-gradient bucket) from dtype when not given;
    with_(dtype=...) had kept the old dtype's: Layout().with_(dtype="bf16") held fp16 gradients
    (Megatron keeps a bf16 model's in fp32) and with_(dtype="fp32") was refused for a
    "--grad-dtype fp16" nobody gave. A gradient dtype or bucket that was given stays."""
    for start in ("fp16", "bf16", "fp32"):
        for dtype in ("fp16", "bf16", "fp32"):
            moved, fresh = Layout(dtype=start).with_(dtype=dtype), Layout(dtype=dtype)
            assert (moved.grad_dtype, moved.bucket_bytes) == (fresh.grad_dtype, fresh.bucket_bytes)
            assert moved == fresh
    given = Layout(dtype="bf16", grad_dtype="bf16", bucket_bytes=1e6).with_(dtype="fp16")
    assert (given.grad_dtype, given.bucket_bytes) == ("bf16", 1e6)
    assert Layout(dtype="bf16").with_(grad_dtype="bf16").bucket_bytes == 40e6 * 2


def test_layout_bookkeeping_flags_are_not_layout_fields_callers_may_give():
    """Layout's grad_dtype_defaulted and bucket_defaulted (init=False) record what __post_init__
    filled in; kit.api.predict_multi_gpu lists Layout's fields as the ones it takes. Listed, they
    were offered as valid and a caller giving one got Layout.__init__'s TypeError traceback, not
    the one-line unknown-field error."""
    from dataclasses import fields

    from kit.api import predict_multi_gpu
    from kit.errors import KitError

    internal = [f.name for f in fields(Layout) if not f.init]
    assert internal  # the flags this guards
    for name in internal:
        with pytest.raises(KitError, match=f"unknown layout field\\(s\\) {name};") as e:
            predict_multi_gpu("gpt2", "dgx-a100", **{name: True})
        valid = str(e.value).split("valid: ")[1]
        assert not any(n in valid for n in internal)
