"""Decode steps: one generated token per sequence with a static KV cache (kit.workload.kv_cache)."""
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from cli_json import cli_json

from kit.cli import main
from kit.errors import KitError
from kit.hardware import get_gpu
from kit.ops import Attention, Gemm
from kit.workload import zoo
from kit.workload.capture import capture
from kit.workload.iteration import iteration
from kit.workload.models import graph_of, memory_bytes

torch.set_num_threads(1)
GPT = {"model_type": "gpt2", "n_embd": 64, "n_head": 4, "n_layer": 2, "vocab_size": 100,
       "n_positions": 64, "name": "tiny-gpt"}
OPT = {"model_type": "opt", "hidden_size": 64, "num_attention_heads": 4, "num_hidden_layers": 2,
       "ffn_dim": 256, "vocab_size": 100, "max_position_embeddings": 64, "name": "tiny-opt"}
LLAMA = {"model_type": "llama", "hidden_size": 64, "num_attention_heads": 8, "num_key_value_heads": 2,
         "num_hidden_layers": 2, "intermediate_size": 128, "vocab_size": 100, "name": "tiny-llama"}


def _gemms(graph):
    return [n for n in graph if n.op_class == "gemm"]


@pytest.mark.parametrize("cfg", [GPT, OPT, LLAMA], ids=["gpt2", "opt", "llama"])
def test_every_weight_gemm_reads_one_token_per_sequence(cfg):
    b, ctx = 3, 20
    g = zoo.graph_for(cfg, batch=b, seq=ctx, mode="decode", dtype="fp16", disk=False)
    assert g.meta["mode"] == "decode" and g.meta["context"] == ctx
    assert {n.phase for n in g} == {"fwd"}
    weights = [n.op for n in _gemms(g) if n.op.kind != "bmm"]
    assert weights and all(op.m * op.b == b for op in weights), [(o.b, o.m) for o in weights]
    # the cache writes: one index_copy_ for keys and one for values per layer, moving the new
    # token's keys (not the cache): b x kv_heads x 1 x head_dim fp16 values, read and written
    writes = [n for n in g if "index_copy" in n.aten]
    assert len(writes) == 2 * 2
    kvh = cfg.get("num_key_value_heads", cfg.get("n_head", cfg.get("num_attention_heads")))
    d = cfg.get("n_embd", cfg.get("hidden_size")) // cfg.get("n_head", cfg.get("num_attention_heads"))
    assert all(n.op.bytes < 4 * (b * kvh * d * 2 + 8) for n in writes), [n.op.bytes for n in writes]


def test_attention_reads_the_whole_cache_from_one_query():
    b, ctx = 2, 30
    g = zoo.graph_for(LLAMA, batch=b, seq=ctx, mode="decode", dtype="bf16", kv_cache="dynamic",
                      disk=False)
    att = [n.op for n in g if n.op_class == "attention"]
    # unmasked (a dynamic cache), flash attention reads grouped K/V heads as they are (no
    # repeat_interleave copies)
    assert att == [Attention(b=b, heads=8, seq_q=1, seq_kv=ctx + 1, head_dim=8, dtype="bf16",
                             causal=False, kv_heads=2)] * 2
    assert not [n for n in g if "repeat_interleave" in n.aten or n.aten.startswith("aten.index.")]
    # a static cache is masked (kit.workload.hf_masks): HF packs each KV head's 4 query heads
    # into its rows, and the kernel reads the additive bf16 mask, a row of ctx + 1 keys a sequence
    static = zoo.graph_for(LLAMA, batch=b, seq=ctx, mode="decode", dtype="bf16", disk=False)
    assert [n.op for n in static if n.op_class == "attention"] == [Attention(
        b=b, heads=2, seq_q=4, seq_kv=ctx + 1, head_dim=8, dtype="bf16", causal=False,
        mask_bytes=b * (ctx + 1) * 2)] * 2
    assert not [n for n in static if "repeat_interleave" in n.aten]
    # GPT-2 as HF 5.25 runs it (SDPA, its default): one masked kernel a layer over the cache
    gpt = zoo.graph_for(GPT, batch=b, seq=ctx, mode="decode", disk=False)
    att = [n.op for n in gpt if n.op_class == "attention"]
    assert len(att) == 2 and {(op.b, op.heads, op.seq_q, op.seq_kv) for op in att} == {(b, 4, 1, ctx + 1)}
    assert not [n for n in _gemms(gpt) if n.op.kind == "bmm"]  # no eager q·K, weights·V


def test_gqa_prefill_in_half_precision_reads_grouped_heads_fp32_repeats():
    half = zoo.graph_for(LLAMA, batch=1, seq=16, mode="train", dtype="fp16", disk=False)
    single = zoo.graph_for(LLAMA, batch=1, seq=16, mode="train", dtype="fp32", disk=False)
    assert {n.op.kv_heads for n in half if n.op_class == "attention" and n.phase == "fwd"} == {2}
    assert {n.op.kv_heads for n in single if n.op_class == "attention" and n.phase == "fwd"} == {None}
    assert not [n for n in half if "repeat_interleave" in n.aten]


def test_kv_cache_bytes_and_memory():
    b, ctx = 4, 40
    g = zoo.graph_for(LLAMA, batch=b, seq=ctx, mode="decode", dtype="bf16", disk=False)
    want = 2 * 2 * b * 2 * (ctx + 1) * 8 * 2  # keys+values x layers x b x kv_heads x len x d x bf16
    assert g.meta["kv_cache_bytes"] == want
    mem = memory_bytes(g)
    assert mem["kv_cache_bytes"] == want and mem["grads_bytes"] == mem["optimizer_bytes"] == 0
    assert mem["buffers_bytes"] == g.meta["buffer_bytes"] > 0  # RoPE's inverse frequencies
    assert mem["total_bytes"] == mem["weights_bytes"] + mem["activations_bytes"] + want + mem["buffers_bytes"]
    # the zoo's 70B model at a long context and a large batch: the cache alone exceeds 80 GB
    big = zoo.graph_for("llama3-70b", batch=64, seq=8192, mode="decode", dtype="bf16", disk=False)
    assert big.meta["kv_cache_bytes"] == 2 * 80 * 64 * 8 * 8193 * 128 * 2
    assert memory_bytes(big)["total_bytes"] > get_gpu("h100-sxm").memory_bytes


def test_decode_step_reads_every_weight_and_grows_with_the_context():
    gpu = get_gpu("h100-sxm")
    short = iteration(zoo.graph_for("llama3-8b", 8, 256, "decode", "bf16", disk=False), gpu)
    long = iteration(zoo.graph_for("llama3-8b", 8, 16384, "decode", "bf16", disk=False), gpu)
    weights = short.meta["param_bytes"]
    # every weight is read once a step: no faster than the weights at the memory roofline
    assert short.kernel_ms >= weights / gpu.mem_bw_bytes_per_s * 1e3
    cls = {r["op_class"]: r["ms"] for r in short.by_class().to_dict("records")}
    cls_long = {r["op_class"]: r["ms"] for r in long.by_class().to_dict("records")}
    assert cls_long["gemm"] == pytest.approx(cls["gemm"])  # the same weight GEMMs
    # attention reads the cache: 64x the context, at least 16x the time (more once bandwidth-bound)
    assert cls_long["attention"] > 16 * cls["attention"]
    # the GPU works longer; the step itself may stay CPU-bound (issuing ~1,000 kernels), as the
    # H200's measured decode steps were (both CPU-bound: the same issue time, summed in another
    # order, equal to rounding)
    assert long.kernel_ms > short.kernel_ms
    assert long.total_ms >= short.total_ms or long.total_ms == pytest.approx(short.total_ms, rel=1e-12)
    # the GPU work of 8 new tokens is far below a forward pass over 8 x 256 tokens, which does
    # 256x the FLOPs for the same weights read
    prefill = iteration(zoo.graph_for("llama3-8b", 8, 256, "inference", "bf16", disk=False), gpu)
    assert short.kernel_ms < prefill.kernel_ms / 4


def test_moe_decode_runs_hf_generates_batched_experts():
    """HF's generate switches grouped_mm experts to batched_mm for its decode steps on GPUs:
    each (token, expert) pair gathers its expert's weights and runs one row through them."""
    moe = {**LLAMA, "model_type": "mixtral", "num_local_experts": 4, "num_experts_per_tok": 2,
           "name": "tiny-moe"}
    g = zoo.graph_for(moe, batch=6, seq=12, mode="decode", disk=False)
    layer0 = [n for n in g if n.module == "layers.0.mlp.experts"]
    bmm = [n.op for n in layer0 if n.op_class == "gemm"]
    pairs = 6 * 2  # 6 tokens, top-2
    assert bmm == [Gemm(m=2 * 128, n=1, k=64, b=pairs, dtype="fp32", kind="bmm", align=8),
                   Gemm(m=64, n=1, k=128, b=pairs, dtype="fp32", kind="bmm", align=8)]
    gathers = [n.op for n in layer0 if n.aten == "aten.index.Tensor"]
    # the gathered weights: a copy of the expert's up and down matrices per pair, read and written
    assert [op.bytes for op in gathers] == [2 * pairs * 2 * 128 * 64 * 4 + pairs * 8,
                                            2 * pairs * 64 * 128 * 4 + pairs * 8]
    # a prefill of the same model runs the grouped GEMM over the experts the tokens reach
    pre = zoo.graph_for(moe, batch=1, seq=3, mode="inference", disk=False)
    grouped = [n.op for n in pre if n.module == "layers.0.mlp.experts" and n.op_class == "gemm"]
    # 6 pairs over 4 experts: shares of 2 rounded up, scaled back to the 6 rows' work
    assert grouped[0].parts == (Gemm(m=2, n=2 * 128, k=64, b=4, dtype="fp32", kind="bmm"),)
    assert grouped[0].flops == pytest.approx(2 * 6 * 64 * 2 * 128)


def test_bad_decode_requests_are_one_clear_error():
    with pytest.raises(KitError, match="decoder-only"):
        zoo.graph_for("bert-base", 1, 16, "decode", disk=False)
    with pytest.raises(KitError, match="optimizer step needs mode train"):
        zoo.graph_for(GPT, 1, 16, "decode", optimizer="adamw", disk=False)
    with pytest.raises(KitError, match="64 tokens and 1 new need 65 positions"):
        zoo.graph_for(GPT, 1, 64, "decode", disk=False)
    zoo.graph_for(GPT, 1, 63, "decode", disk=False)
    with pytest.raises(KitError, match="unknown mode"):
        zoo.graph_for(GPT, 1, 16, "sample", disk=False)
    with pytest.raises(KitError, match="decode_inputs"):
        graph_of(nn.Linear(4, 4), 1, 8, mode="decode")


class _UserDecoder(nn.Module):
    """A user's own decoder with a decode_inputs(batch, context), as the zoo's have."""

    def __init__(self):
        super().__init__()
        self.emb, self.qkv, self.out = nn.Embedding(10, 32), nn.Linear(32, 96), nn.Linear(32, 10)

    def forward(self, ids, cache):
        q, k, v = self.qkv(self.emb(ids)).unsqueeze(1).chunk(3, dim=-1)
        pos = torch.tensor([cache[0].size(2) - 1], device=ids.device)
        cache[0].index_copy_(2, pos, k)
        cache[1].index_copy_(2, pos, v)
        return self.out(F.scaled_dot_product_attention(q, *cache).squeeze(1))

    def decode_inputs(self, batch, context):
        return (torch.zeros(batch, 1, dtype=torch.long),
                (torch.zeros(batch, 1, context + 1, 32), torch.zeros(batch, 1, context + 1, 32)))


def test_a_users_module_decodes_through_its_decode_inputs():
    g = graph_of(_UserDecoder(), 2, 100, mode="decode", dtype="fp16")
    assert g.meta["mode"] == "decode" and g.meta["context"] == 100
    assert g.meta["kv_cache_bytes"] == 2 * 2 * 101 * 32 * 2
    att = [n.op for n in g if n.op_class == "attention"]
    assert att == [Attention(b=2, heads=1, seq_q=1, seq_kv=101, head_dim=32, dtype="fp16")]


def test_cli_predict_and_compare_report_tokens_per_second(capsys):
    r = cli_json(capsys, ["predict", "gpt2", "--gpu", "a100-pcie-40gb", "--mode", "decode",
                       "--batch", "4", "--seq", "100"])
    assert r["mode"] == "decode" and r["context"] == 100 and set(r["phases_ms"]) == {"fwd"}
    assert r["tokens_per_s"] == pytest.approx(4 / r["total_ms"] * 1e3)
    assert r["kv_cache_bytes"] == 2 * 12 * 4 * 12 * 101 * 64 * 4  # fp32, 12 layers, 12 heads
    assert r["memory"]["kv_cache_bytes"] == r["kv_cache_bytes"]
    c = cli_json(capsys, ["compare", "gpt2", "--gpus", "a100-pcie-40gb,t4", "--mode", "decode",
                       "--batch", "4", "--seq", "100"])
    assert c["unit"] == "tokens" and c["context"] == 100
    for row in c["rows"]:
        assert row["tokens_per_s"] == pytest.approx(4 / row["step_ms"] * 1e3)
        assert row["fits"] and row["max_batch"] >= 4
    assert main(["predict", "gpt2", "--gpu", "t4", "--mode", "decode", "--seq", "100"]) == 0
    assert "tokens/s" in capsys.readouterr().out
    assert main(["predict", "bert-base", "--gpu", "t4", "--mode", "decode"]) == 2
    assert "decoder-only" in capsys.readouterr().err
    assert main(["predict", "gpt2", "--system", "dgx-a100", "--mode", "decode"]) == 2
    assert "drop --mode decode" in capsys.readouterr().err


def test_cuda_graphs_take_the_host_out_of_a_decode_step(capsys):
    argv = ["predict", "gpt2", "--gpu", "h100-sxm", "--mode", "decode", "--batch", "4", "--seq",
            "256", "--dtype", "bf16", "--fusion", "compiled"]
    plain, graphs = cli_json(capsys, argv), cli_json(capsys, argv + ["--cuda-graphs"])
    assert plain["gpu_idle_ms"] > 0  # eager-launched, the small model waits on the CPU
    assert graphs["cpu_ms"] == 0 and graphs["total_ms"] == pytest.approx(graphs["kernel_ms"])
    assert graphs["kernel_ms"] == pytest.approx(plain["kernel_ms"])
    assert graphs["overhead"]["source"].startswith("cuda graph")
    assert main(argv + ["--cuda-graphs", "--overhead-trace", "t.json"]) == 2
    assert "give one" in capsys.readouterr().err
    assert main(["predict", "gpt2", "--system", "dgx-a100", "--cuda-graphs"]) == 2
    assert "--cuda-graphs is a single-GPU option" in capsys.readouterr().err


def test_max_batch_is_the_largest_batch_whose_memory_fits():
    from kit.workload.models import max_batch

    gpu = get_gpu("l4")
    for model, ctx in (("llama3-8b", 8192), ("gpt2", 1000)):
        mem = memory_bytes(zoo.graph_for(model, 8, ctx, "decode", "bf16", disk=False))
        top = max_batch(mem, 8, gpu.memory_bytes)
        assert top > 0
        at = memory_bytes(zoo.graph_for(model, top, ctx, "decode", "bf16", disk=False))
        over = memory_bytes(zoo.graph_for(model, top + 1, ctx, "decode", "bf16", disk=False))
        assert at["total_bytes"] <= gpu.memory_bytes < over["total_bytes"], (model, top)
    big = memory_bytes(zoo.graph_for("llama3-70b", 1, 128, "decode", "bf16", disk=False))
    assert max_batch(big, 1, gpu.memory_bytes) == 0  # 140 GB of weights on a 24 GB card


def test_a_dynamic_cache_copies_itself_every_step():
    """HF's DynamicCache: torch.cat per layer for keys and for values, reading the whole cache
    and writing it a token longer; a static cache writes only the new token."""
    b, ctx = 2, 40
    static = zoo.graph_for(LLAMA, batch=b, seq=ctx, mode="decode", dtype="bf16", disk=False)
    dynamic = zoo.graph_for(LLAMA, batch=b, seq=ctx, mode="decode", dtype="bf16", disk=False,
                            kv_cache="dynamic")
    assert dynamic.meta["kv_cache"] == "dynamic" and static.meta["kv_cache"] == "static"
    assert not [n for n in dynamic if "index_copy" in n.aten]
    layer = b * 2 * ctx * 8 * 2  # one layer's keys: b x kv_heads x ctx x head_dim x bf16
    grown = b * 2 * (ctx + 1) * 8 * 2
    cats = [n for n in dynamic if n.aten.startswith("aten.cat") and n.out_bytes == grown]
    assert len(cats) == 2 * 2  # keys and values, 2 layers (RoPE's rotate_half cats are small)
    assert all(n.op.bytes >= layer + grown for n in cats), [n.op.bytes for n in cats]
    att = {n.op.seq_kv for n in dynamic if n.op_class == "attention"}
    assert att == {n.op.seq_kv for n in static if n.op_class == "attention"} == {ctx + 1}
    assert dynamic.meta["kv_cache_bytes"] == static.meta["kv_cache_bytes"]
    gpu = get_gpu("h100-sxm")
    slow = iteration(zoo.graph_for("llama3-8b", 32, 8192, "decode", "bf16", disk=False,
                                   kv_cache="dynamic"), gpu)
    fast = iteration(zoo.graph_for("llama3-8b", 32, 8192, "decode", "bf16", disk=False), gpu)
    cache = fast.meta["kv_cache_bytes"]
    # the copies read and write the whole cache: at least that many bytes at peak bandwidth more
    assert slow.kernel_ms - fast.kernel_ms > 2 * cache / gpu.mem_bw_bytes_per_s * 1e3 * 0.9
    with pytest.raises(KitError, match="is for decoding"):
        zoo.graph_for(LLAMA, 1, 16, "inference", kv_cache="dynamic", disk=False)
    with pytest.raises(KitError, match="unknown KV cache"):
        zoo.graph_for(LLAMA, 1, 16, "decode", kv_cache="paged", disk=False)
    with pytest.raises(KitError, match="brings its own cache"):
        graph_of(_UserDecoder(), 2, 100, mode="decode", kv_cache="dynamic")
    assert main(["predict", "gpt2", "--gpu", "t4", "--kv-cache", "dynamic"]) == 2
    for flag in (["--kv-cache", "dynamic"], ["--new-tokens", "8"]):  # --system would drop them
        assert main(["predict", "gpt2", "--system", "dgx-a100", *flag]) == 2


def test_sliding_window_layers_keep_only_the_window():
    from kit.workload.kv_cache import cache_bytes, check_decode_step, make_cache

    cache = make_cache("static", 2, 3, 4, 16, 8, windows=[4, 0, 32])
    assert [c.keys.shape[2] for c in cache] == [4, 17, 17]  # full window; all tokens; not yet full
    assert [c.sliding for c in cache] == [True, False, False] and check_decode_step(cache, 1) == 16
    grown = make_cache("dynamic", 2, 1, 4, 16, 8, windows=[4])[0]
    assert grown.keys.shape[2] == 3  # window - 1, and the step's token makes it 4
    # after the step the full window is a view of the concatenation, whose storage holds 4 tokens
    assert cache_bytes(make_cache("dynamic", 2, 1, 4, 16, 8, windows=[4])) == 2 * 2 * 4 * 4 * 8 * 4

    # Gemma 3's pattern: every third layer global here, the others slide over 4 tokens
    gemma3 = {"model_type": "gemma3_text", "hidden_size": 32, "num_attention_heads": 4,
              "num_key_value_heads": 2, "head_dim": 8, "num_hidden_layers": 6,
              "intermediate_size": 48, "vocab_size": 50, "sliding_window": 4,
              "sliding_window_pattern": 3}
    step = zoo.graph_for(gemma3, batch=2, seq=16, mode="decode", disk=False)
    kv = {n.layer: n.op.seq_kv for n in step if n.op_class == "attention"}
    assert kv == {0: 4, 1: 4, 2: 17, 3: 4, 4: 4, 5: 17}
    assert "replicated_from" not in step.meta  # the layers differ: all six captured
    model = zoo.build(gemma3)
    full = capture(model, model.decode_inputs(2, 16), mode="inference")
    assert [(n.aten, n.module, n.op) for n in step] == [(n.aten, n.module, n.op) for n in full]
    unslid = zoo.graph_for({**gemma3, "sliding_window": None}, batch=2, seq=16, mode="decode", disk=False)
    assert step.meta["kv_cache_bytes"] < unslid.meta["kv_cache_bytes"]
    # shorter than the window, a sliding layer is like any other; a static one's mask also
    # holds the window's overlay (kv > q - window: a sub and a gt), which changes no key, and-ed
    # with the causal part by and_masks (a one-element True, two &s; masking_utils.py:51-55,
    # 132-136), where a full layer's mask is the causal part alone (tests/test_decode_static_mask.py)
    early, plain = (zoo.graph_for(c, batch=2, seq=2, mode="decode", disk=False)
                    for c in (gemma3, {**gemma3, "sliding_window": None}))
    attn = lambda g: [(n.aten, n.op) for n in g if n.op_class == "attention"]  # noqa: E731
    assert attn(early) == attn(plain) and len(attn(early)) == 6
    assert {n.aten for n in early if n.op_class != "attention"} - {n.aten for n in plain} == {
        "aten.sub.Tensor", "aten.gt.Tensor", "aten.ones.default", "aten.bitwise_and.Tensor"} - {
        n.aten for n in plain}
    early, plain = (zoo.graph_for(c, batch=2, seq=2, mode="decode", disk=False, kv_cache="dynamic")
                    for c in (gemma3, {**gemma3, "sliding_window": None}))  # both unmasked
    assert [(n.aten, n.op) for n in early] == [(n.aten, n.op) for n in plain]
    # Mistral slides on every layer: they stay alike, and one stands for the rest
    mistral = {**LLAMA, "model_type": "mistral", "num_hidden_layers": 5, "sliding_window": 8}
    fast = zoo.graph_for(mistral, batch=2, seq=16, mode="decode", disk=False)
    assert fast.meta.get("replicated_from") == 3
    assert {n.op.seq_kv for n in fast if n.op_class == "attention"} == {8}
