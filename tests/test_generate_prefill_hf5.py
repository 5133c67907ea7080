"""Generate's prefill as HF transformers 5.25 runs it for GPT-2, OPT and Llama (kit.workload.
kv_cache.hf_prefill_update; expectations read off transformers 5.25's source):
* every layer's first cache update initialises its StaticLayer (cache_utils.py:424-466): two
  torch.zeros of the preallocated (batch, heads, max_cache_len, head_dim), then
  cumulative_length.to(device), a blocking copy from host memory (a host wait), inside the layer,
  before its attention; then update's arange + add, add_, and two index_copy_ (:479-485);
* no mask: sdpa_mask skips it for an empty cache (masking_utils.py:297-300), so SDPA runs
  is_causal (sdpa_attention.py:149); update returns the whole preallocated keys (:494), of which
  sdpa_attention_forward keeps the first q_length rows (sdpa_attention.py:164-173: unmasked,
  causal, more keys than queries), so the attention is square, P x P: the flash kernel (over all
  max_cache_len keys it would have been the memory-efficient one, flash refusing a non-square
  causal mask, sdp_utils.cpp check_flash_causal_non_square_seqlens);
* OPT's positions from torch.ones(b, s) in fp32, cumsum, * ones, - 1, long (modeling_opt.py:
  350-359), no HF 4 float causal mask;
* inference without a cache (kit validate's NeuSight labels) is HF 4's eager pass, unchanged."""
import pytest
import torch

from kit.errors import KitError
from kit.workload.host_wait import H2D_COPY
from kit.workload.models import graph_of

B, P, CAP = 2, 8, 12  # a prompt of 8, a cache preallocated for 12 (prompt + new tokens - 1)
GPT2 = {"model_type": "gpt2", "n_layer": 2, "n_embd": 64, "n_head": 4, "vocab_size": 100,
        "n_positions": 64}
OPT = {"model_type": "opt", "num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4,
       "ffn_dim": 256, "vocab_size": 100, "max_position_embeddings": 64}
LLAMA = {"model_type": "llama", "num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4,
         "num_key_value_heads": 2, "intermediate_size": 128, "vocab_size": 100}
KV_HEADS = {"gpt2": 4, "opt": 4, "llama": 2}


def _prefill(cfg):
    return graph_of(cfg, B, P, "inference", "fp16", last_logits=True, cache_len=CAP)


@pytest.mark.parametrize("cfg", [GPT2, OPT, LLAMA], ids=["gpt2", "opt", "llama"])
def test_each_layer_initialises_its_static_layer_then_attends_over_the_prompts_rows(cfg):
    g = _prefill(cfg)
    kv = KV_HEADS[cfg["model_type"]]
    for layer in range(2):
        nodes = [n for n in g.nodes if n.layer == layer]
        names = [n.aten for n in nodes]
        attn = next(i for i, n in enumerate(nodes) if "attention" in n.aten)
        before = names[:attn]
        # lazy_initialization: two zero fills of the preallocated rows, the blocking copy
        zeros = [nodes[i] for i, a in enumerate(before) if a == "aten.zeros.default"]
        assert len(zeros) == 2 and all(n.kernels == 1 for n in zeros)
        assert before.count(H2D_COPY) == 1
        assert before.index(H2D_COPY) > max(i for i, a in enumerate(before) if a == "aten.zeros.default")
        # update: arange + cumulative_length, add_, the two index_copy_ of the prompt's rows
        copies = [n for n in nodes[:attn] if n.aten == "aten.index_copy_.default"]
        assert [c.shapes for c in copies] == [f"[{B},{kv},{CAP},16]x[{P}]x[{B},{kv},{P},16]"] * 2
        assert before.index(H2D_COPY) < names.index("aten.index_copy_.default")
        a = nodes[attn]
        assert a.aten == "aten._scaled_dot_product_flash_attention.default"
        assert (a.op.seq_q, a.op.seq_kv, a.op.causal, a.op.mask_bytes) == (P, P, True, 0)
    assert sum(n.aten == H2D_COPY for n in g.nodes) == 2  # one a layer
    # the writes are in their layers: nothing of the cache's after the LM head
    assert not any(n.op_class == "kv_cache" for n in g.nodes)
    assert "softmax" not in " ".join(n.aten for n in g.nodes)  # no HF 4 eager attention


def test_opt_prefill_positions_as_hf5_and_no_hf4_float_mask():
    names = [n.aten for n in _prefill(OPT).nodes if n.layer is None][:8]
    assert names[:6] == ["aten.embedding.default", "aten.ones.default", "aten.cumsum.default",
                         "aten.mul.Tensor", "aten.sub.Tensor", "aten._to_copy.default"]
    assert not any(n.aten in ("aten.masked_fill.Scalar", "aten.masked_fill_.Scalar", "aten.full.default")
                   for n in _prefill(OPT).nodes)


@pytest.mark.parametrize("cfg", [GPT2, OPT], ids=["gpt2", "opt"])
def test_inference_without_a_cache_stays_hf4_eager(cfg):
    g = graph_of(cfg, B, P, "inference", "fp16")
    names = [n.aten for n in g.nodes]
    assert "aten._softmax.default" in names and H2D_COPY not in names
    assert not any("scaled_dot_product" in a for a in names)


def test_cache_len_outside_decode_and_generate_prefill_is_refused():
    with pytest.raises(KitError, match="goes with mode decode, not train"):
        graph_of(GPT2, B, P, "train", "fp16", cache_len=CAP)
    # an encoder has no generate prefill (every zoo decoder's is modelled)
    with pytest.raises(KitError, match="goes with mode decode, not inference"):
        graph_of("bert-base", B, P, "inference", "fp16", cache_len=CAP)


def test_flash_takes_square_causal_only():
    from kit.workload.gpu_kernels import _fused_sdpa
    from kit.workload.recorder import Recorder

    q = torch.empty(2, 4, 8, 16, dtype=torch.float16, device="meta")
    for keys, want in ((8, "flash"), (12, "efficient")):
        k = torch.empty(2, 4, keys, 16, dtype=torch.float16, device="meta")
        with Recorder() as rec:
            _fused_sdpa(q, k, k, is_causal=True)
        assert [n.aten for n in rec.nodes if "attention" in n.aten] == \
            [f"aten._scaled_dot_product_{want}_attention.default"]


def test_a_prefill_cache_shorter_than_the_prompt_is_refused():
    """generate's prefill writes the prompt's seq rows into the preallocated cache (HF 5.25's
    index_copy_ at positions 0..seq - 1 fails past the cache's rows): a cache_len under seq is
    one clear error, not a priced graph; seq rows exactly is the smallest that fits."""
    with pytest.raises(KitError, match="preallocated for 4 tokens cannot take a prompt of 8"):
        graph_of("gpt2", 1, 8, "inference", cache_len=4)
    graph_of("gpt2", 1, 8, "inference", cache_len=8)


def _dynamic_prefill(cfg):
    return graph_of(cfg, B, P, "inference", "fp16", last_logits=True, kv_cache="dynamic")


@pytest.mark.parametrize("cfg", [GPT2, OPT, LLAMA], ids=["gpt2", "opt", "llama"])
def test_a_dynamic_prefill_concatenates_inside_each_layer_then_attends_causally(cfg):
    """generate's prefill into a DynamicCache (transformers 5.25): each layer's first update runs
    DynamicLayer.lazy_initialization (cache_utils.py:113-117: torch.tensor([]) for the keys and
    values, empty 1-D tensors: no zeros, no copy of cumulative_length, no host wait), then
    update's torch.cat of each onto its empty tensor (:136-137): one copy of the prompt's P rows
    for the keys and one for the values, read and written once, inside the layer before its
    attention. The mask is skipped (q_length == kv_length == P, masking_utils.py:291-292), so
    SDPA runs is_causal (sdpa_attention.py:149) over the P concatenated keys: square, the flash
    kernel. The zoo had run HF 4's eager attention (matmul, softmax) for GPT-2 and OPT and
    appended the cats after the LM head."""
    g = _dynamic_prefill(cfg)
    kv = KV_HEADS[cfg["model_type"]]
    one = B * kv * P * 16 * 2  # one layer's prompt keys (or values), fp16
    for layer in range(2):
        nodes = [n for n in g.nodes if n.layer == layer]
        attn = next(i for i, n in enumerate(nodes) if "attention" in n.aten)
        # the cache's cats (onto an empty 1-D tensor; Llama's rotate_half has cats of its own)
        cats = [n for n in nodes if n.aten == "aten.cat.default" and n.shapes.startswith("[0]x")]
        assert [nodes.index(c) < attn for c in cats] == [True, True]
        assert [c.shapes for c in cats] == [f"[0]x[{B},{kv},{P},16]"] * 2
        assert [(c.kernels, c.op.bytes) for c in cats] == [(1, 2 * one)] * 2
        a = nodes[attn]
        assert a.aten == "aten._scaled_dot_product_flash_attention.default"
        assert (a.op.seq_q, a.op.seq_kv, a.op.causal, a.op.mask_bytes) == (P, P, True, 0)
    names = [n.aten for n in g.nodes]
    assert sum(n.shapes.startswith("[0]x") for n in g.nodes) == 4  # two a layer, none elsewhere
    assert H2D_COPY not in names and "aten.zeros.default" not in names
    assert "aten.index_copy_.default" not in names
    assert not any(n.op_class == "kv_cache" for n in g.nodes)
    assert "softmax" not in " ".join(names)  # no HF 4 eager attention
    assert g.meta["prefill_kv_cache"] == "dynamic"


def test_a_dynamic_prefill_is_generates_and_no_other_inference():
    """The dynamic prefill is an inference pass with the last position's logits (generate's):
    an inference pass with a dynamic cache otherwise, or of a model that is no decoder, is
    refused as before; it is cached apart from the plain pass and the static prefill."""
    with pytest.raises(KitError, match="is for decoding"):
        graph_of(GPT2, B, P, "inference", "fp16", kv_cache="dynamic")
    with pytest.raises(KitError, match="is for decoding"):
        graph_of("bert-base", B, P, "inference", "fp16", last_logits=True, kv_cache="dynamic")
    keys = {graph_of("gpt2", 1, 8, "inference", last_logits=True, **kw).meta["cache_key"]
            for kw in ({}, {"kv_cache": "dynamic"}, {"cache_len": 8})}
    assert len(keys) == 3


# one dense layer, then an MoE one (first_k_dense_replace 1): the prefill's experts as generate's
DEEPSEEK = {"model_type": "deepseek_v3", "hidden_size": 32, "num_attention_heads": 4,
            "num_hidden_layers": 2, "intermediate_size": 48, "moe_intermediate_size": 16,
            "vocab_size": 50, "kv_lora_rank": 16, "q_lora_rank": None, "qk_nope_head_dim": 8,
            "qk_rope_head_dim": 4, "v_head_dim": 8, "n_routed_experts": 4, "num_experts_per_tok": 2,
            "n_shared_experts": 1, "n_group": 1, "topk_group": 1, "first_k_dense_replace": 1}


@pytest.mark.parametrize("kind", ["static", "dynamic"])
def test_deepseek_prefill_writes_its_latents_inside_each_layer_then_expands_what_the_cache_returns(kind):
    """HF 5.25's DeepseekV3Attention under generate's prefill (modeling_deepseek_v3.py:441-466):
    the compressed latent (b, 1, s, kv_lora_rank) and the rotary key (b, 1, s, qk_rope_head_dim)
    go through cache.update, then expand_kv runs kv_b_proj over all the cache returns: a static
    cache's whole preallocated CAP rows (StaticLayer.update returns self.keys, cache_utils.py:494;
    lazy_initialization's two zeros and the blocking copy first), a dynamic one's P rows (two
    cats onto empty tensors, cache_utils.py:113-137); SDPA is_causal, unmasked, over the first P
    keys (sdpa_attention.py:164-173 cuts a static cache's), its query and key heads 12 wide, the
    values 8: not flash (torch's flash kernel takes one head size), the memory-efficient kernel. The prefill runs before generate's
    _optimize_model_for_decode (generation/utils.py:3211, 3232), so its experts stay grouped_mm;
    the zoo had priced the pass without a cache and appended the writes after the LM head."""
    cap = CAP if kind == "static" else None
    g = graph_of(DEEPSEEK, B, P, "inference", "fp16", last_logits=True, kv_cache=kind,
                 cache_len=cap)
    keys = CAP if kind == "static" else P
    for layer in range(2):
        nodes = [n for n in g.nodes if n.layer == layer]
        names = [n.aten for n in nodes]
        attn = next(i for i, n in enumerate(nodes) if "attention" in n.aten)
        a = nodes[attn]
        assert a.aten == "aten._scaled_dot_product_efficient_attention.default"
        assert (a.op.seq_q, a.op.seq_kv, a.op.causal, a.op.mask_bytes) == (P, P, True, 0)
        if kind == "static":
            writes = [n for n in nodes if n.aten == "aten.index_copy_.default"]
            assert [w.shapes for w in writes] == [f"[{B},1,{CAP},16]x[{P}]x[{B},1,{P},16]",
                                                  f"[{B},1,{CAP},4]x[{P}]x[{B},1,{P},4]"]
            assert names[:attn].count("aten.zeros.default") == 2 and names.count(H2D_COPY) == 1
        else:
            writes = [n for n in nodes if n.aten == "aten.cat.default" and n.shapes.startswith("[0]x")]
            assert [w.shapes for w in writes] == [f"[0]x[{B},1,{P},16]", f"[0]x[{B},1,{P},4]"]
            assert H2D_COPY not in names and "aten.zeros.default" not in names
        assert all(nodes.index(w) < attn for w in writes)
        # expand_kv: kv_b_proj (16 -> 4 heads x (8 + 8)) over every row the cache returned
        expand = [n for n in nodes if n.op_class == "gemm" and n.shapes.endswith("x[16,64]")]
        assert [n.op.m for n in expand] == [B * keys]
    moe = [n.aten for n in g.nodes if n.layer == 1]
    assert "aten._grouped_mm.default" in moe and "aten.bmm.default" not in moe
    assert not any(n.op_class == "kv_cache" for n in g.nodes)


MISTRAL = {"model_type": "mistral", "hidden_size": 64, "num_attention_heads": 4,
           "num_key_value_heads": 2, "num_hidden_layers": 2, "intermediate_size": 128,
           "vocab_size": 100, "sliding_window": 8}


@pytest.mark.parametrize("kind,prompt,cap", [("static", 5, 12), ("static", 8, 12),
                                             ("static", 20, 24), ("static", 5, 6),
                                             ("dynamic", 5, None), ("dynamic", 20, None)])
def test_a_sliding_window_prefill_initialises_writes_and_masks_inside_each_layer(kind, prompt, cap):
    """generate's prefill of a sliding-window layer (window 8), transformers 5.25:
    * static (StaticSlidingWindowLayer, rows = min(8, max_cache_len), cache_utils.py:538-611):
      StaticLayer's lazy_initialization (two zeros of `rows`, one blocking copy); a prompt that
      fits is index_copy_'d and self.keys (rows) returned; one that overfills the rows has its last
      rows copy_'d in, no positions made, and the prompt's own keys returned;
    * dynamic (DynamicSlidingWindowLayer, :196-249): torch.tensor([]) keys and values, the window
      tensor moved to the device (one blocking copy), two cats, the whole prompt returned;
    * the mask (get_mask_sizes before the update, :259-268, :626-640): kv_length the keys above
      (static: rows, or the prompt where it overfills; dynamic: the prompt), skipped below the
      window (SDPA is_causal over the first P keys, flash), built from it (boolean, sliding
      causal), where sdpa_attention_forward repeats the two KV heads to four (repeat_kv: a copy
      each, sdpa_attention.py:119-128) for the masked call (the zoo's enable_gqa under a mask
      captures as the same two copies, kit.workload.gpu_kernels).
    The zoo had priced the prefill without a cache, the writes appended after the LM head."""
    g = graph_of(MISTRAL, B, prompt, "inference", "fp16", last_logits=True, kv_cache=kind,
                 cache_len=cap)
    w, kv = 8, 2
    rows = min(w, cap) if kind == "static" else 0
    keys = max(rows, prompt)
    masked = keys >= w
    for layer in range(2):
        nodes = [n for n in g.nodes if n.layer == layer]
        names = [n.aten for n in nodes]
        attn = next(i for i, n in enumerate(nodes) if "attention" in n.aten)
        before = names[:attn]
        assert before.count(H2D_COPY) == 1
        if kind == "dynamic":
            cats = [n.shapes for n in nodes[:attn] if n.shapes.startswith("[0]x")]
            assert cats == [f"[0]x[{B},{kv},{prompt},16]"] * 2
            assert "aten.zeros.default" not in names
        else:
            assert before.count("aten.zeros.default") == 2
            if prompt > rows:
                copies = [n.shapes for n in nodes[:attn] if n.aten == "aten.copy_.default"]
                assert copies == [f"[{B},{kv},{rows},16]x[{B},{kv},{rows},16]"] * 2
                assert "aten.index_copy_.default" not in names
            else:
                copies = [n.shapes for n in nodes[:attn] if n.aten == "aten.index_copy_.default"]
                assert copies == [f"[{B},{kv},{rows},16]x[{prompt}]x[{B},{kv},{prompt},16]"] * 2
        a = nodes[attn]
        if masked:
            assert a.aten == "aten._scaled_dot_product_efficient_attention.default"
            assert (a.op.seq_q, a.op.seq_kv, a.op.causal) == (prompt, keys, False)
            assert a.op.mask_bytes > 0
            clones = [n.shapes for n in nodes[:attn] if n.aten == "aten.clone.default"]
            assert clones == [f"[{B},{kv},2,{keys},16]"] * 2
        else:
            assert a.aten == "aten._scaled_dot_product_flash_attention.default"
            assert (a.op.seq_q, a.op.seq_kv, a.op.causal, a.op.mask_bytes) == (prompt, prompt, True, 0)
            assert "aten.clone.default" not in before
    assert not any(n.op_class == "kv_cache" for n in g.nodes)


def test_a_hybrid_prefill_keeps_its_full_layers_apart_from_its_sliding_ones():
    """Gemma 3 (window 8 on five layers in six: layer 5 of 8 is full attention): in a dynamic
    prefill each sliding layer moves its window tensor to the device (one blocking copy,
    cache_utils.py:218-220), the full layer does not (DynamicLayer, :113-117). The capture of a
    few layers repeated for the rest had given the full layer a sliding one's copy (8, not 7)."""
    g3 = {"model_type": "gemma3_text", "hidden_size": 64, "num_attention_heads": 4,
          "num_key_value_heads": 2, "head_dim": 16, "num_hidden_layers": 8,
          "intermediate_size": 128, "vocab_size": 100, "sliding_window": 8}
    g = graph_of(g3, B, 5, "inference", "fp16", last_logits=True, kv_cache="dynamic")
    assert [n.layer for n in g.nodes if n.aten == H2D_COPY] == [0, 1, 2, 3, 4, 6, 7]


GEMMA2 = {"model_type": "gemma2", "hidden_size": 64, "num_attention_heads": 4,
          "num_key_value_heads": 2, "num_hidden_layers": 2, "intermediate_size": 128,
          "vocab_size": 100, "sliding_window": 8, "head_dim": 16, "final_logit_softcapping": 30.0}


@pytest.mark.parametrize("kind,prompt,cap", [("static", 5, 12), ("static", 20, 24),
                                             ("dynamic", 5, None), ("dynamic", 20, None)])
def test_gemma2s_eager_prefill_attends_over_what_its_cache_layers_return(kind, prompt, cap):
    """Gemma 2 runs eager attention (_supports_sdpa False, modeling_gemma2.py:353): its
    eager_attention_forward (:176-207) repeats the KV heads, then matmul, soft-cap, + mask,
    softmax, matmul over every key the cache layer returns, no cut (sdpa_attention_forward's cut
    is SDPA's): layer 0 sliding (window 8), layer 1 full. Static: the full layer's whole
    preallocated CAP rows, the sliding one's min(8, CAP) rows or the prompt where it overfills
    them; dynamic: the prompt's P. eager_mask never skips (masking_utils.py:598-618): one
    additive mask a layer kind, (P, keys). Each layer's cache initialised and written before its
    attention, as the SDPA decoders' (two zeros and a blocking copy for a static layer; a dynamic
    sliding layer's window tensor copy; two cats for a dynamic one)."""
    g = graph_of(GEMMA2, B, prompt, "inference", "fp16", last_logits=True, kv_cache=kind,
                 cache_len=cap)
    rows = {0: min(8, cap) if cap else 0, 1: cap or 0}
    for layer in (0, 1):
        keys = max(rows[layer], prompt)
        nodes = [n for n in g.nodes if n.layer == layer]
        names = [n.aten for n in nodes]
        first_bmm = names.index("aten.bmm.default")
        assert [n.shapes for n in nodes if n.aten == "aten._softmax.default"] == \
            [f"[{B},4,{prompt},{keys}]"]
        assert nodes[first_bmm].shapes == f"[{B * 4},{prompt},16]x[{B * 4},16,{keys}]"
        writes = [n for n in nodes[:first_bmm] if n.aten in (
            "aten.index_copy_.default", "aten.copy_.default") or n.shapes.startswith("[0]x")]
        assert len(writes) == 2
        assert names[:first_bmm].count(H2D_COPY) == (1 if kind == "static" or layer == 0 else 0)
    masks = sorted(n.shapes for n in g.nodes if n.layer is None and n.aten == "aten.where.self")
    want = {0: max(rows[0], prompt), 1: max(rows[1], prompt)}
    assert masks == sorted(f"[{B},1,{prompt},{k}]x[]x[]" for k in want.values())
    assert not any(n.op_class == "kv_cache" for n in g.nodes)


# GPT-OSS: 4 query heads on 2 KV heads of 16, window 8; layer 0 sliding, layer 1 full (HF's
# default layer_types, configuration_gpt_oss.py:84-87: sliding where (i + 1) % 2)
GPT_OSS = {"model_type": "gpt_oss", "hidden_size": 64, "num_attention_heads": 4,
           "num_key_value_heads": 2, "num_hidden_layers": 2, "intermediate_size": 32,
           "vocab_size": 100, "sliding_window": 8, "head_dim": 16, "num_local_experts": 4,
           "num_experts_per_tok": 2}


@pytest.mark.parametrize("kind,prompt,cap", [("static", 5, 12), ("static", 20, 24),
                                             ("dynamic", 5, None), ("dynamic", 20, None)])
def test_gpt_oss_eager_prefill_softmaxes_over_its_keys_and_the_sink(kind, prompt, cap):
    """GPT-OSS runs eager attention (_supports_sdpa False, modeling_gpt_oss.py:378), HF 5.25's
    eager_attention_forward (:225-254): the KV heads repeated (repeat_kv, a copy each), matmul,
    * scaling, + the layer kind's mask, then the head's sink logit joins every row as one more
    column (cat), the row max is subtracted, softmax in the logits' own dtype (no fp32 cast,
    unlike Gemma 2's), the sink column dropped, matmul with the values over every key the cache
    layer returned. cache.update (:305) runs inside the attention, before it; the model builds
    two masks (:458-468, create_causal_mask and create_sliding_window_causal_mask), each eager,
    never skipped (masking_utils.py:552). Keys: static, the full layer's preallocated CAP rows,
    the sliding one's min(8, CAP) rows (StaticSlidingWindowLayer, cache_utils.py:538-540) or the
    prompt where it overfills them (its last 8 rows copy_'d in); dynamic: the prompt's P."""
    g = graph_of(GPT_OSS, B, prompt, "inference", "fp16", last_logits=True, kv_cache=kind,
                 cache_len=cap)
    heads, kv, d = 4, 2, 16
    rows = {0: min(8, cap) if cap else 0, 1: cap or 0}
    keys = {layer: max(rows[layer], prompt) for layer in rows}
    for layer in (0, 1):
        n_keys = keys[layer]
        nodes = [n for n in g.nodes if n.layer == layer]
        names = [n.aten for n in nodes]
        bmms = [i for i, a in enumerate(names) if a == "aten.bmm.default"]
        first, second = bmms[0], bmms[1]
        assert nodes[first].shapes == f"[{B * heads},{prompt},{d}]x[{B * heads},{d},{n_keys}]"
        assert nodes[second].shapes == f"[{B * heads},{prompt},{n_keys}]x[{B * heads},{n_keys},{d}]"
        between = nodes[first + 1:second]
        seq = [n.aten for n in between if n.op_class != "free"]
        assert seq == ["aten.mul.Tensor", "aten.add.Tensor", "aten.cat.default", "aten.max.dim",
                       "aten.sub.Tensor", "aten._softmax.default"]
        rows_q = f"{B},{heads},{prompt}"
        assert [n.shapes for n in between if n.op_class != "free"] == [
            f"[{rows_q},{n_keys}]", f"[{rows_q},{n_keys}]x[{B},1,{prompt},{n_keys}]",
            f"[{rows_q},{n_keys}]x[{rows_q},1]", f"[{rows_q},{n_keys + 1}]",
            f"[{rows_q},{n_keys + 1}]x[{rows_q},1]", f"[{rows_q},{n_keys + 1}]"]
        # repeat_kv: the keys and the values each copied to the query heads, before the scores
        assert [n.shapes for n in nodes[:first] if n.aten == "aten.clone.default"] == \
            [f"[{B},{kv},2,{n_keys},{d}]"] * 2
        # the cache initialised and written inside the layer, before its attention
        before = names[:first]
        if kind == "dynamic":
            writes = [n.shapes for n in nodes[:first] if n.shapes.startswith("[0]x")]
            assert writes == [f"[0]x[{B},{kv},{prompt},{d}]"] * 2
            assert "aten.zeros.default" not in names
            assert before.count(H2D_COPY) == (1 if layer == 0 else 0)  # the window tensor's move
        else:
            assert before.count("aten.zeros.default") == 2 and before.count(H2D_COPY) == 1
            if prompt > rows[layer]:
                writes = [n.shapes for n in nodes[:first] if n.aten == "aten.copy_.default"]
                assert writes == [f"[{B},{kv},{rows[layer]},{d}]x[{B},{kv},{rows[layer]},{d}]"] * 2
            else:
                writes = [n.shapes for n in nodes[:first] if n.aten == "aten.index_copy_.default"]
                assert writes == [f"[{B},{kv},{rows[layer]},{d}]x[{prompt}]x[{B},{kv},{prompt},{d}]"] * 2
    masks = sorted(n.shapes for n in g.nodes if n.layer is None and n.aten == "aten.where.self")
    assert masks == sorted(f"[{B},1,{prompt},{k}]x[]x[]" for k in keys.values())
    assert not any(n.op_class == "kv_cache" for n in g.nodes)


def test_gpt_oss_sink_takes_its_share_of_each_rows_softmax_and_is_dropped():
    """The numbers of the same eager pass (modeling_gpt_oss.py:236-252), by hand: with s the
    scaled scores plus the mask and z a head's sink, a key's weight is exp(s_j) / (sum_k
    exp(s_k) + exp(z)): the sink takes its share of the row and no value. Masked keys (-inf)
    weigh nothing."""
    from kit.workload.zoo_modern import LlamaAttention

    torch.manual_seed(0)
    attn = LlamaAttention(GPT_OSS)
    with torch.no_grad():
        attn.sinks.copy_(torch.tensor([0.0, 1.5, -2.0, 3.0]))
    q, k, v = torch.randn(1, 4, 3, 16), torch.randn(1, 2, 5, 16), torch.randn(1, 2, 5, 16)
    mask = torch.zeros(1, 1, 3, 5)
    mask[..., 3:] = float("-inf")  # the last two keys hidden from every query
    got = attn._eager(q, k, v, mask)
    for h in range(4):
        kh, vh = k[0, h // 2], v[0, h // 2]  # query heads 0, 1 read KV head 0; 2, 3 head 1
        e = torch.exp(q[0, h] @ kh.T * 16 ** -0.5 + mask[0, 0])
        w = e / (e.sum(-1, keepdim=True) + torch.exp(attn.sinks[h]))
        assert torch.allclose(got[0, h], w @ vh, atol=1e-5)
    assert w.sum(-1).max() < 1  # the sink's share: the rows' weights no longer sum to one
