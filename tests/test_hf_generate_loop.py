"""HF transformers 5.25's greedy generate() runs GPU work of its own around every forward pass
(generation/utils.py, stopping_criteria.py; kit.workload.hf_generate): a generation's prefill and
decode steps are priced with it. Every expected op below is read off HF's source lines, named at
each; the kernel counts are counted by hand from them."""
import pytest

from kit.workload.generation import generation, hf_loop, static_cache_len
from kit.workload.hf_generate import hf_step_ops
from kit.workload.iteration import iteration
from kit.workload.models import graph_of

GPU = "h100-sxm"
LLAMA = {"model_type": "llama", "hidden_size": 64, "num_attention_heads": 4,
         "num_key_value_heads": 2, "num_hidden_layers": 2, "intermediate_size": 128,
         "vocab_size": 100, "name": "tiny-llama"}
B, P, N, V = 2, 12, 5, 100

# after each forward pass, one (aten op, kernels, shapes) per kernel-launching op, for input_ids
# and position_ids of L tokens (shapes filled in below):
AFTER = [
    # _update_model_kwargs_for_generation (utils.py:1279-1285): arange(1).view(...) +
    # position_ids[..., -1:] + 1, then cat([position_ids, next_position_ids])
    ("aten.arange.default", 1, ""), ("aten.add.Tensor", 1, "[1,1]x[{b},1]"),
    ("aten.add.Tensor", 1, "[{b},1]"), ("aten.cat.default", 1, "[{b},{L}]x[{b},1]"),
    # _sample :3251 outputs.logits[:, -1].to(copy=True, dtype=float32); :3282 argmax
    ("aten._to_copy.default", 1, "[{b},{V}]"), ("aten.argmax.default", 1, "[{b},{V}]"),
    # :3286 next_tokens * unfinished + pad * (1 - unfinished): mul, rsub, mul, add
    ("aten.mul.Tensor", 1, "[{b}]x[{b}]"), ("aten.rsub.Scalar", 1, "[{b}]"),
    ("aten.mul.Tensor", 1, "[]x[{b}]"), ("aten.add.Tensor", 1, "[{b}]x[{b}]"),
    # :3289 cat([input_ids, next_tokens[:, None]])
    ("aten.cat.default", 1, "[{b},{L}]x[{b},1]"),
    # StoppingCriteriaList (stopping_criteria.py:620-622): full(False), then per criterion an |:
    # MaxLengthCriteria's full((b,), is_done) (:86); EosTokenCriteria's isin(...).any(-1) (:592),
    # isin two CUDA kernels (ATen isin_Tensor_Tensor_out: out.fill_, isin_default_kernel)
    ("aten.full.default", 1, ""), ("aten.full.default", 1, ""),
    ("aten.bitwise_or.Tensor", 1, "[{b}]x[{b}]"), ("aten.isin.Tensor_Tensor", 2, "[{b},1]x[1]"),
    ("aten.any.dim", 1, "[{b},1]"), ("aten.bitwise_or.Tensor", 1, "[{b}]x[{b}]"),
    # utils.py:3291 unfinished & ~done; :397 StopCheck bool(unfinished.max() == 0)
    ("aten.bitwise_not.default", 1, "[{b}]"), ("aten.bitwise_and.Tensor", 1, "[{b}]x[{b}]"),
    ("aten.max.default", 1, "[{b}]"), ("aten.eq.Scalar", 1, "[]"),
]
# before it, prepare_inputs_for_generation: input_ids[:, -n:].clone() (:703-705), and
# position_ids[..., -n:].clone() where they are not n long already (:719-724)
BEFORE_DECODE = [("aten.clone.default", 1, "[{b},1]"), ("aten.clone.default", 1, "[{b},1]")]
BEFORE_PREFILL = [("aten.clone.default", 1, "[{b},{P}]")]


def _expected(rows, **sizes):
    return [(a, k, s.format(**sizes)) for a, k, s in rows]


def _kernels(nodes):
    return [(n.aten, n.kernels, n.shapes) for n in nodes if n.kernels]


def test_a_decode_step_runs_hfs_greedy_loop_ops():
    L = P + 3  # input_ids after 3 new tokens
    import torch

    pre, post = hf_step_ops(B, L, 1, V, torch.bfloat16)
    assert _kernels(pre) == _expected(BEFORE_DECODE, b=B)
    assert _kernels(post) == _expected(AFTER, b=B, L=L, V=V)
    assert sum(k for _, k, _ in AFTER + BEFORE_DECODE) == 24
    # StopCheck's bool() reads the flag on the host (:397): the step's last op, no kernel
    assert post[-1].aten == "aten._local_scalar_dense.default" and post[-1].kernels == 0


def test_the_prefill_runs_them_with_the_whole_prompt_cloned_once():
    import torch

    pre, post = hf_step_ops(B, P, P, V, torch.bfloat16)
    assert _kernels(pre) == _expected(BEFORE_PREFILL, b=B, P=P)  # position_ids are P long: uncut
    assert _kernels(post) == _expected(AFTER, b=B, L=P, V=V)


def _hf_rows(it):
    return it.timeline[it.timeline["op_class"] == "generate"]


def test_generation_prices_every_step_with_hfs_loop():
    """A generation's TTFT and decode steps are the forward passes with HF's loop ops: 23 kernels
    more in the prefill and 24 a decode step (it had priced the forward passes alone)."""
    cap = static_cache_len(LLAMA, P, N, "static")
    # the decode steps eager, as asked (disable_compile: HF's default compiles them,
    # tests/test_generate_hf_auto_compile.py)
    r = generation(LLAMA, GPU, batch=B, prompt=P, new_tokens=N, dtype="bf16", disable_compile=True)
    # HF 5.25's prefill, its cache written inside each layer (tests/test_generate_prefill_hf5.py)
    prefill_graph = graph_of(LLAMA, B, P, "inference", "bf16", last_logits=True, cache_len=cap)
    bare_prefill = iteration(prefill_graph, GPU)
    looped = hf_loop(LLAMA, B)
    prefill = iteration(looped(prefill_graph, P, P), GPU)
    assert int(_hf_rows(prefill)["kernels"].sum()) == 23
    assert r["ttft_ms"] == pytest.approx(prefill.total_ms)
    assert r["prefill"]["kernel_ms"] == pytest.approx(
        bare_prefill.kernel_ms + float(_hf_rows(prefill)["latency_ms"].sum()))
    for s in r["decode_steps"]:
        c = s["context"]
        bare = graph_of(LLAMA, B, c, "decode", "bf16", kv_cache="static", cache_len=cap)
        step = iteration(looped(bare, c + 1, 1), GPU)
        assert int(_hf_rows(step)["kernels"].sum()) == 24
        assert s["ms"] == pytest.approx(step.total_ms)
        assert s["kernel_ms"] == pytest.approx(iteration(bare, GPU).kernel_ms
                                               + float(_hf_rows(step)["latency_ms"].sum()))
        assert s["ms"] > iteration(bare, GPU).total_ms


def test_each_step_ends_at_hfs_host_sync():
    """StopCheck's bool() (utils.py:397) makes the host wait for the GPU every step: the step ends
    when both are done, its host read after its last kernel, so the next step starts drained."""
    cap = static_cache_len(LLAMA, P, N, "static")
    bare = graph_of(LLAMA, B, P, "decode", "bf16", kv_cache="static", cache_len=cap)
    step = iteration(hf_loop(LLAMA, B)(bare, P + 1, 1), GPU)
    assert step.meta["trailing_free"]["ops"] >= 1  # the host read, after the last kernel
    t = step.timeline
    assert step.total_ms >= float(t["gpu_end_ms"].max())
    assert step.total_ms >= float(t["cpu_end_ms"].max()) + step.meta["trailing_free"]["ms"]


def test_under_cuda_graphs_the_loop_ops_keep_their_host_cost():
    """HF's loop ops run eagerly around the captured forward (reduce-overhead graphs the model's
    forward only: modeling_utils.py get_compiled_call; the loop is _sample's Python): under
    --cuda-graphs each still costs eager PyTorch's dispatch and launches, the forward's ops none.
    It had zeroed them with the forward."""
    from kit.workload.iteration import CUDA_GRAPH, CpuOverhead

    eager = CpuOverhead()
    cap = static_cache_len(LLAMA, P, N, "static")
    bare = graph_of(LLAMA, B, P, "decode", "bf16", kv_cache="static", cache_len=cap)
    step = iteration(hf_loop(LLAMA, B)(bare, P + 1, 1), GPU, overhead=CUDA_GRAPH)
    t = step.timeline
    host_us = (t["cpu_end_ms"] - t["cpu_start_ms"]) * 1e3
    loop = t["op_class"] == "generate"
    assert (host_us[~loop] == 0).all()
    # each loop op: its dispatch and a launch per kernel (HF's lines, above), plus the views
    # dispatched just before it (the slices: free ops at eager's free_op_us each)
    ops_us = sum(eager.cpu_op_us + eager.launch_us * k for _, k, _ in AFTER + BEFORE_DECODE)
    views = (float(host_us[loop].sum()) - ops_us) / eager.free_op_us
    assert views >= 0 and views == pytest.approx(round(views))
    # the stop check's host read ends the step, at eager cost
    assert step.meta["trailing_free"]["ms"] == pytest.approx(eager.free_op_us / 1e3)
    assert step.total_ms > iteration(bare, GPU, overhead=CUDA_GRAPH).total_ms + float(
        t.loc[loop, "latency_ms"].sum())
