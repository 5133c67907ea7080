"""GPT-2, OPT and DeepSeek-V3 decode steps as HF transformers 5.25 runs them: its default
attention for all three is SDPA (modeling_utils.py:1856, _supports_sdpa in modeling_gpt2.py:420,
modeling_opt.py:267, modeling_deepseek_v3.py:525), each model calls create_causal_mask
(modeling_gpt2.py:583, modeling_opt.py:363, modeling_deepseek_v3.py:593), and a static cache is
written by StaticLayer.update (cache_utils.py:479-485) and read whole. Expected counts by hand
from those sources; the shapes from the configs below."""
import pytest

from kit.workload import zoo
from kit.workload.generation import static_cache_len

B, CONTEXT, CAP = 2, 8, 12
GPT2 = {"model_type": "gpt2", "n_embd": 32, "n_head": 4, "n_layer": 2, "vocab_size": 50,
        "n_positions": 64}
OPT = {"model_type": "opt", "hidden_size": 32, "num_attention_heads": 4, "num_hidden_layers": 2,
       "ffn_dim": 64, "vocab_size": 50, "max_position_embeddings": 64}
DEEPSEEK = {"model_type": "deepseek_v3", "hidden_size": 32, "num_attention_heads": 4,
            "num_hidden_layers": 2, "intermediate_size": 48, "moe_intermediate_size": 16,
            "vocab_size": 50, "kv_lora_rank": 16, "q_lora_rank": None, "qk_nope_head_dim": 8,
            "qk_rope_head_dim": 4, "v_head_dim": 8, "n_routed_experts": 4, "num_experts_per_tok": 2,
            "n_shared_experts": 1, "n_group": 1, "topk_group": 1, "first_k_dense_replace": 2}
# per family: (config, heads, query/key head size, value head size, cache rows' heads and sizes)
FAMILIES = {"gpt2": (GPT2, 4, 8, 8), "opt": (OPT, 4, 8, 8), "deepseek": (DEEPSEEK, 4, 12, 8)}


def _step(cfg, cache="static", cache_len=None):
    return zoo.graph_for(cfg, B, CONTEXT, "decode", "fp16", kv_cache=cache, cache_len=cache_len,
                         disk=False)


def _count(g, aten):
    return sum(1 for n in g if n.aten == aten and n.kernels)


@pytest.mark.parametrize("family", FAMILIES)
def test_a_static_step_is_hfs_masked_sdpa_over_the_preallocated_cache(family):
    """SDPA with the boolean (b, 1, 1, max_cache_len) mask of the whole preallocated cache
    (StaticLayer.get_mask_sizes, cache_utils.py:496-500): the memory-efficient kernel, one a
    layer, no eager matmul/softmax. The zoo had run GPT-2 and OPT eagerly (bmm or matmul,
    softmax) over context + 1 rows, DeepSeek unmasked on flash attention."""
    cfg, heads, qk, v = FAMILIES[family]
    g = _step(cfg, cache_len=CAP)
    attn = [(n.aten, n.shapes) for n in g if n.op_class == "attention"]
    shapes = f"[{B},{heads},1,{qk}]x[{B},{heads},{CAP},{qk}]x[{B},{heads},{CAP},{v}]x[{B},1,1,{CAP}]"
    assert attn == [("aten._scaled_dot_product_efficient_attention.default", shapes)] * 2
    assert _count(g, "aten._softmax.default") == 0 and _count(g, "aten.bmm.default") == 0
    # the mask once a step (sdpa_mask, masking_utils.py:528-539): key index <= query position,
    # then generate's contiguous copy of its batch expansion (generation/utils.py:754-762)
    assert [n.shapes for n in g if n.aten == "aten.le.Tensor"] == [f"[1,1,1,{CAP}]x[1,1,1,1]"]
    assert [n.shapes for n in g if n.aten == "aten.clone.default"] == [f"[{B},1,1,{CAP}]"]


@pytest.mark.parametrize("family", FAMILIES)
def test_a_static_step_writes_as_hfs_static_layer(family):
    """StaticLayer.update a layer: arange(1) + cumulative_length (two kernels), the length's
    in-place add_, one index_copy_ each for keys and values (cache_utils.py:479-485); HF 4's one
    model-wide cache_position arange is gone."""
    cfg = FAMILIES[family][0]
    g = _step(cfg, cache_len=CAP)
    layers = 2
    assert _count(g, "aten.index_copy_.default") == 2 * layers
    assert _count(g, "aten.add_.Tensor") == layers
    # layers' positions + the mask's batch, head, query and key indices (hf_sdpa_mask)
    assert _count(g, "aten.arange.default") == layers + 4
    writes = [n.shapes for n in g if n.aten == "aten.index_copy_.default"]
    assert all(f",{CAP}," in s.split("x")[0] for s in writes)  # into the preallocated rows


@pytest.mark.parametrize("family", FAMILIES)
def test_a_dynamic_step_is_unmasked_sdpa(family):
    """Over a DynamicCache HF skips the mask of a one-token query (masking_utils.py:292): SDPA
    unmasked, flash attention in fp16, no mask ops; DeepSeek's values narrower than its keys
    go to the memory-efficient kernel all the same (torch's flash kernel takes one head size,
    sdp_utils check_head_dim_size_flash)."""
    cfg, heads, qk, v = FAMILIES[family]
    g = _step(cfg, "dynamic")
    attn = [(n.aten, n.shapes) for n in g if n.op_class == "attention"]
    keys = CONTEXT + 1
    kernel = "flash" if qk == v else "efficient"
    assert attn == [(f"aten._scaled_dot_product_{kernel}_attention.default",
                     f"[{B},{heads},1,{qk}]x[{B},{heads},{keys},{qk}]x[{B},{heads},{keys},{v}]")] * 2
    assert _count(g, "aten.le.Tensor") == 0


def test_opts_position_mask_is_generates_mask_over_a_static_cache_and_ones_over_a_dynamic_one():
    """OPTDecoder (modeling_opt.py:347-354) builds torch.ones(b, past + 1) (fp32) only when no
    attention_mask is given. Under generate a static step is given the 4D mask
    prepare_inputs_for_generation builds for a compileable cache (generation/utils.py:729-760):
    no ones, no past_seen_tokens + 1 (a static cache's cumulative_length is a device tensor,
    cache_utils.py:502-504, so that sum had been a kernel and a host read of its value); a
    dynamic step gets none (generate drops an all-ones mask, :2900-2910), so it fills the ones.
    HF 4's float causal mask (full, masked_fill) and cumsum positions are gone from both."""
    from kit.workload.host_wait import HOST_WAITS

    static, dynamic = _step(OPT, cache_len=CAP), _step(OPT, "dynamic")
    assert _count(static, "aten.ones.default") == 0 and not any(n.aten in HOST_WAITS for n in static)
    ones = [n.out_bytes for n in dynamic if n.aten == "aten.ones.default" and n.kernels]
    assert ones == [B * (CONTEXT + 1) * 4]  # fp32, (b, past + 1)
    for g in (static, dynamic):
        assert _count(g, "aten.cumsum.default") == 0 and _count(g, "aten.masked_fill_.Scalar") == 0


@pytest.mark.parametrize("cfg", [GPT2, OPT, DEEPSEEK])
def test_generation_preallocates_every_decoders_static_cache(cfg):
    """generate sizes the StaticCache max_length - 1 = prompt + new - 1 (generation/utils.py:
    2039, 2966) for these families too; they had kept context + 1 (None)."""
    assert static_cache_len(cfg, 10, 5, "static") == 14
    assert static_cache_len(cfg, 10, 5, "dynamic") is None
