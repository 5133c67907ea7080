"""Does the zoo run what Hugging Face's own modeling code runs? Both captured by the kit, compared.

For each family, a small config is built twice: as the zoo's plain-torch model
(kit.workload.zoo.build) and as transformers' own model (AutoModelForCausalLM.from_config on the
meta device, T5ForConditionalGeneration for t5), with SDPA attention (eager for gemma2 and
gpt_oss, which HF runs eagerly: soft-capping, attention sinks). Both are captured by kit.workload.capture in inference and training, and compared
per op class: kernels, GFLOP and MB moved, the zoo's against HF's; and, for the decoders, one
decode step over 16 cached tokens: HF's DynamicCache (filled with meta tensors) and its MoE
experts switched to batched_mm, as generate runs a decode step on a GPU, against the zoo's
decode step with `kv_cache="dynamic"`.

Prints JSON: per family, mode and class {zoo: [kernels, gflop, mb], hf: [...], same: bool}, and per
family `gemm_attention_same`: whether the GEMM and attention kernels, FLOPs and bytes are
identical in every mode (what sets most of a step's time). Small elementwise differences (HF's
rotary scaling multiplies, its mask construction) are reported, not judged.

gpt2, opt and bert are listed under `hf4_families`: the zoo builds them as NeuSight's labels ran
them (HF 4's eager attention: bmm, softmax, bmm), while HF 5 runs SDPA, so their attention
differs on purpose.

    pip install transformers   # not a dependency of the kit; any transformers 5
    .venv/bin/python benchmarks/hf_fidelity.py [--dtype bf16] [--families mixtral,gemma3_text]

Not run by the tests (CI has no transformers). Takes about a minute on two cores.
"""
from __future__ import annotations

import argparse
import json
import sys
import warnings
from collections import defaultdict

TINY = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 100}
MOE = {"num_experts_per_tok": 2, "moe_intermediate_size": 32}
FAMILIES = {
    "llama": {**TINY, "max_position_embeddings": 128},
    "mistral": {**TINY, "sliding_window": 8},
    "mixtral": {**TINY, "num_local_experts": 4, "num_experts_per_tok": 2},
    "qwen2": dict(TINY),
    "qwen3": {**TINY, "head_dim": 32},
    "qwen2_moe": {**TINY, **MOE, "num_experts": 4, "shared_expert_intermediate_size": 96},
    "qwen3_moe": {**TINY, **MOE, "num_experts": 4, "head_dim": 16},
    "gemma": {**TINY, "num_key_value_heads": 1, "head_dim": 32},
    "gemma2": {**TINY, "head_dim": 32, "sliding_window": 8},
    "gemma3_text": {**TINY, "num_key_value_heads": 1, "head_dim": 32, "sliding_window": 8},
    "phi3": {**TINY, "num_key_value_heads": 4, "pad_token_id": 0, "bos_token_id": 1,
             "eos_token_id": 1},
    "deepseek_v3": {"hidden_size": 32, "intermediate_size": 64, "moe_intermediate_size": 16,
                    "num_hidden_layers": 3, "num_attention_heads": 4, "num_key_value_heads": 4,
                    "n_routed_experts": 8, "n_shared_experts": 1, "num_experts_per_tok": 2,
                    "n_group": 4, "topk_group": 2, "first_k_dense_replace": 1, "q_lora_rank": 24,
                    "kv_lora_rank": 16, "qk_nope_head_dim": 8, "qk_rope_head_dim": 4,
                    "v_head_dim": 8, "vocab_size": 50},
    "gpt_oss": {**TINY, "head_dim": 16, "intermediate_size": 32, "num_local_experts": 4,
                "num_experts_per_tok": 2, "sliding_window": 8},
    "t5": {"d_model": 64, "d_ff": 128, "d_kv": 16, "num_layers": 2, "num_decoder_layers": 2,
           "num_heads": 4, "vocab_size": 100},
}
HF4_FAMILIES = {
    "gpt2": {"n_embd": 64, "n_layer": 2, "n_head": 4, "vocab_size": 100, "n_positions": 64,
             "bos_token_id": 0, "eos_token_id": 0},
    "opt": {"hidden_size": 64, "ffn_dim": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
            "vocab_size": 100, "max_position_embeddings": 64, "word_embed_proj_dim": 64,
            "pad_token_id": 1, "bos_token_id": 2, "eos_token_id": 2},
}
KEY_CLASSES = ("gemm", "attention")


def hf_model(family: str, cfg: dict):
    import torch
    import transformers

    hf_cfg = transformers.AutoConfig.for_model(family, **cfg)
    hf_cfg._attn_implementation = "eager" if family in ("gemma2", "gpt_oss") else "sdpa"
    with torch.device("meta"):
        if family == "t5":
            return transformers.T5ForConditionalGeneration(hf_cfg)
        return transformers.AutoModelForCausalLM.from_config(hf_cfg)


def by_class(graph) -> dict:
    out = defaultdict(lambda: [0, 0.0, 0.0])
    for n in graph:
        if n.op is None:
            continue
        row = out[n.op_class]
        row[0] += n.kernels
        row[1] += float(n.op.flops) / 1e9
        row[2] += float(n.op.bytes) / 1e6
    return {k: [v[0], round(v[1], 6), round(v[2], 6)] for k, v in out.items()}


def compare(family: str, cfg: dict, dtype: str, batch: int = 2, seq: int = 16) -> dict:
    import torch

    from kit.workload import zoo
    from kit.workload.capture import capture

    ours, theirs = zoo.build({"model_type": family, **cfg}), hf_model(family, cfg)
    count = lambda m: sum(p.numel() for p in {id(p): p for p in m.parameters()}.values())  # noqa: E731
    result = {"params": {"zoo": count(ours), "hf": count(theirs)}, "modes": {}}
    ids = torch.zeros(batch, seq, dtype=torch.long)
    hf_inputs = ({"input_ids": ids, "decoder_input_ids": ids, "use_cache": False} if family == "t5"
                 else {"input_ids": ids, "use_cache": False})
    key_same = True
    for mode in ("inference", "train"):
        try:
            zoo_cls = by_class(capture(ours, ours.example_inputs(batch, seq), mode=mode, dtype=dtype))
            hf_cls = by_class(capture(theirs, hf_inputs, mode=mode, dtype=dtype))
        except Exception as e:  # report the family, go on with the rest
            result["modes"][mode] = {"error": f"{type(e).__name__}: {str(e)[:300]}"}
            key_same = False
            continue
        rows = {}
        for cls in sorted(set(zoo_cls) | set(hf_cls)):
            z, h = zoo_cls.get(cls, [0, 0.0, 0.0]), hf_cls.get(cls, [0, 0.0, 0.0])
            same = z[0] == h[0] and all(abs(a - b) <= 1e-6 * max(abs(b), 1e-9) for a, b in zip(z[1:], h[1:]))
            rows[cls] = {"zoo": z, "hf": h, "same": same}
            if cls in KEY_CLASSES and not same:
                key_same = False
        result["modes"][mode] = rows
    if family != "t5":  # a decode step: one new token a sequence over `seq` cached, as generate runs it
        try:
            zoo_cls = by_class(zoo.graph_for({"model_type": family, **cfg}, batch=batch, seq=seq,
                                             mode="decode", dtype=dtype, kv_cache="dynamic", disk=False))
            hf_cls = by_class(_hf_decode(theirs, family, batch, seq, dtype))
            rows = {}
            for cls in sorted(set(zoo_cls) | set(hf_cls)):
                z, h = zoo_cls.get(cls, [0, 0.0, 0.0]), hf_cls.get(cls, [0, 0.0, 0.0])
                same = z[0] == h[0] and all(abs(a - b) <= 1e-6 * max(abs(b), 1e-9)
                                            for a, b in zip(z[1:], h[1:]))
                rows[cls] = {"zoo": z, "hf": h, "same": same}
                if cls in KEY_CLASSES and not same:
                    key_same = False
            result["modes"]["decode"] = rows
        except Exception as e:
            result["modes"]["decode"] = {"error": f"{type(e).__name__}: {str(e)[:300]}"}
            key_same = False
    result["gemm_attention_same"] = key_same
    return result


def _hf_decode(model, family: str, batch: int, context: int, dtype: str):
    """HF's decode step: its DynamicCache holding `context` tokens (meta tensors), one new token
    a sequence; MoE experts switched to batched_mm, as generate does on GPUs."""
    import torch
    import transformers

    from kit.workload.capture import TORCH_DTYPES, capture

    if family in ("mixtral", "qwen2_moe", "qwen3_moe", "deepseek_v3", "gpt_oss"):
        model.set_experts_implementation("batched_mm")
    c = model.config
    heads = c.num_attention_heads
    kv_heads = 1 if family == "deepseek_v3" else getattr(c, "num_key_value_heads", heads)
    head = getattr(c, "head_dim", None) or c.hidden_size // heads
    # DeepSeek's MLA caches its compressed latent and rotary key, one head of each
    k_dim, v_dim = ((c.kv_lora_rank, c.qk_rope_head_dim) if family == "deepseek_v3" else (head, head))
    cache = transformers.DynamicCache(config=c)
    kind = TORCH_DTYPES[dtype]
    for layer in range(c.num_hidden_layers):
        cache.update(torch.zeros(batch, kv_heads, context, k_dim, device="meta", dtype=kind),
                     torch.zeros(batch, kv_heads, context, v_dim, device="meta", dtype=kind), layer)
    ids = torch.zeros(batch, 1, dtype=torch.long)
    return capture(model, {"input_ids": ids, "past_key_values": cache, "use_cache": True},
                   mode="inference", dtype=dtype)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dtype", default="bf16", choices=("fp32", "fp16", "bf16"))
    ap.add_argument("--families", default="", help="comma-separated (default: all)")
    args = ap.parse_args()
    try:
        import transformers
    except ImportError:
        sys.exit("hf_fidelity: needs transformers (pip install transformers); it is not a "
                 "dependency of the kit")
    warnings.filterwarnings("ignore")
    transformers.logging.set_verbosity_error()
    wanted = {f for f in args.families.split(",") if f}
    out = {"transformers": transformers.__version__, "dtype": args.dtype, "families": {},
           "hf4_families": {}}
    for table, name in ((FAMILIES, "families"), (HF4_FAMILIES, "hf4_families")):
        for family, cfg in table.items():
            if not wanted or family in wanted:
                out[name][family] = compare(family, cfg, args.dtype)
    out["summary"] = {f: r["gemm_attention_same"] for f, r in out["families"].items()}
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
