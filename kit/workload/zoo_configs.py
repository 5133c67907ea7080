"""The zoo's named configs (HF key names): GPT-2/3, BERT, OPT, Llama-family, MoE, T5, DLRM and
vision models, with their sources, and name resolution (case and punctuation do not matter;
NeuSight's config names are aliases). kit.workload.zoo builds and captures them."""
from __future__ import annotations

import re

from kit.errors import KitError


def _gpt(n_embd, n_head, n_layer, n_positions=1024):
    return {"model_type": "gpt2", "activation_function": "gelu_new", "n_embd": n_embd,
            "n_head": n_head, "n_layer": n_layer, "n_positions": n_positions, "vocab_size": 50257,
            "attn_pdrop": 0.1, "embd_pdrop": 0.1, "resid_pdrop": 0.1, "layer_norm_epsilon": 1e-5}


def _bert(hidden, heads, layers, ff):
    return {"model_type": "bert", "hidden_act": "gelu", "hidden_size": hidden,
            "num_attention_heads": heads, "num_hidden_layers": layers, "intermediate_size": ff,
            "max_position_embeddings": 512, "type_vocab_size": 2, "vocab_size": 30522,
            "attention_probs_dropout_prob": 0.1, "hidden_dropout_prob": 0.1, "layer_norm_eps": 1e-12}


def _llama(hidden, layers, heads, kv_heads, ff, vocab, theta, **extra):
    return {"model_type": "llama", "hidden_size": hidden, "num_hidden_layers": layers,
            "num_attention_heads": heads, "num_key_value_heads": kv_heads, "intermediate_size": ff,
            "vocab_size": vocab, "rope_theta": theta, "rms_norm_eps": 1e-5,
            "max_position_embeddings": 8192, **extra}


def _switch(d_model, d_ff, d_kv, heads, layers, experts=4):
    return {"model_type": "switch_transformers", "d_model": d_model, "d_ff": d_ff, "d_kv": d_kv,
            "num_heads": heads, "num_layers": layers, "num_decoder_layers": layers,
            "num_experts": experts, "expert_capacity": 64, "encoder_sparse_step": 2,
            "decoder_sparse_step": 2, "vocab_size": 32128, "dropout_rate": 0.1,
            "layer_norm_epsilon": 1e-6, "relative_attention_num_buckets": 32}


# name: (config, default seq, aliases). Sources: GPT-2 (Radford et al. 2019, HF configs);
# GPT-3 XL..13B: NeuSight's DLmodel_configs (its gpt3_xl has n_embd 3072 = the paper's 24 heads
# of 128, so 2.9B parameters, not the paper's 1.3B XL; the zoo keeps it so the labels compare like
# for like); GPT-3 1.3B (the paper's XL: 24 layers, d_model 2048; its 24 heads of 128 do not split
# 2048 in a GPT-2 block, so 16 heads of 128, GPT-Neo 1.3B's layout, with the same parameters) and
# 175B: Brown et al. 2020, Table 2.1;
# BERT: Devlin et al. 2019; OPT-1.3B: HF facebook/opt-1.3b; Llama-3: Meta's model cards
# (8B: 4096/32 layers/8 KV heads/14336; 70B: 8192/80/8/28672, vocab 128256, theta 5e5);
# Mixtral 8x7B: Mistral AI's config; Qwen2.5-7B, Qwen3-8B, Gemma-7B, Phi-3-mini (4k): the
# config.json of Qwen/Qwen2.5-7B, Qwen/Qwen3-8B, google/gemma-7b, microsoft/Phi-3-mini-4k-instruct
# on the HF Hub; T5-Base and Flan-T5-XL: the config.json of google-t5/t5-base and
# google/flan-t5-xl (Raffel et al. 2020; Chung et al. 2022); Gemma-2-9B and Gemma-3-1B: the
# config.json of google/gemma-2-9b and google/gemma-3-1b-pt; Qwen3-30B-A3B: Qwen/Qwen3-30B-A3B's
# config.json; DeepSeek-V3: deepseek-ai/DeepSeek-V3's config.json (the HF model, without the
# multi-token-prediction layer); Switch-XL4: NeuSight's switchxl4.json; Switch-Base-4: the
# switch-base architecture (Fedus et al. 2021; HF google/switch-base-8) with 4 experts, as NeuSight's
# L4 label "switch4" shows it (per-node CSV: 12+12 blocks, d_model 768, d_ff 3072, 4 experts with
# capacity 64, 12 heads, vocab 32128; no DLmodel_config ships for it); DLRM: MLPerf's
# Criteo config (13 dense features, 26 tables, dim 128, bottom 512-256, top 1024-1024-512-256);
# ResNet-50: He et al. 2016, Table 1 (50-layer, bottleneck [3, 4, 6, 3]) with torchvision's v1.5
# stride placement, 25,557,032 parameters; VGG-16: Simonyan & Zisserman 2015, Table 1 config D,
# 138,357,544 parameters; ViT-B/16: Dosovitskiy et al. 2021, Table 1 (ViT-Base: 12 layers, 768,
# MLP 3072, 12 heads, patch 16), 86,567,656 parameters (torchvision's counts for all three).
ZOO = {
    "gpt2": (_gpt(768, 12, 12), 1024, ("gpt2-small", "gpt2_small", "gpt2s")),
    "gpt2-medium": (_gpt(1024, 16, 24), 1024, ("gpt2_med", "gpt2-m", "gpt2m")),
    "gpt2-large": (_gpt(1280, 20, 36), 1024, ("gpt2_large", "gpt2-l", "gpt2l")),
    "gpt2-xl": (_gpt(1600, 25, 48), 1024, ("gpt2_xl",)),
    "gpt3-xl": (_gpt(3072, 24, 24, 2048), 2048, ("gpt3_xl",)),
    "gpt3-1.3b": (_gpt(2048, 16, 24, 2048), 2048, ("gpt3-xl-paper",)),
    "gpt3-2.7b": (_gpt(2560, 32, 32, 2048), 2048, ("gpt3_27", "gpt3-2p7b")),
    "gpt3-6.7b": (_gpt(4096, 32, 32, 2048), 2048, ("gpt3_67", "gpt3-6p7b")),
    "gpt3-13b": (_gpt(5120, 40, 40, 2048), 2048, ("gpt3_13",)),
    "gpt3-175b": (_gpt(12288, 96, 96, 2048), 2048, ("gpt3", "gpt3_175")),
    "bert-base": (_bert(768, 12, 12, 3072), 512, ("bert", "bert_base")),
    "bert-large": (_bert(1024, 16, 24, 4096), 512, ("bert_large",)),
    "opt-1.3b": ({"model_type": "opt", "activation_function": "relu", "hidden_size": 2048,
                  "num_attention_heads": 32, "num_hidden_layers": 24, "ffn_dim": 8192,
                  "vocab_size": 50272, "max_position_embeddings": 2048, "word_embed_proj_dim": 2048,
                  "dropout": 0.1, "attention_dropout": 0.0, "do_layer_norm_before": True},
                 2048, ("opt_13", "opt-1p3b")),
    "llama3-8b": (_llama(4096, 32, 32, 8, 14336, 128256, 500000.0), 8192, ("llama-3-8b", "llama3_8b")),
    "llama3-70b": (_llama(8192, 80, 64, 8, 28672, 128256, 500000.0), 8192, ("llama-3-70b", "llama3_70b")),
    "mixtral-8x7b": (_llama(4096, 32, 32, 8, 14336, 32000, 1e6, model_type="mixtral",
                            num_local_experts=8, num_experts_per_tok=2), 4096, ("mixtral",)),
    "qwen2.5-7b": (_llama(3584, 28, 28, 4, 18944, 152064, 1e6, model_type="qwen2",
                          rms_norm_eps=1e-6, max_position_embeddings=32768,
                          tie_word_embeddings=False), 4096, ("qwen2.5_7b", "qwen25-7b")),
    "qwen3-8b": (_llama(4096, 36, 32, 8, 12288, 151936, 1e6, model_type="qwen3", head_dim=128,
                        rms_norm_eps=1e-6, max_position_embeddings=40960,
                        tie_word_embeddings=False), 4096, ("qwen3_8b",)),
    "gemma-7b": (_llama(3072, 28, 16, 16, 24576, 256000, 10000.0, model_type="gemma",
                        head_dim=256, rms_norm_eps=1e-6, hidden_act="gelu_pytorch_tanh",
                        tie_word_embeddings=True), 4096, ("gemma_7b",)),
    "gemma2-9b": (_llama(3584, 42, 16, 8, 14336, 256000, 10000.0, model_type="gemma2",
                         head_dim=256, rms_norm_eps=1e-6, hidden_activation="gelu_pytorch_tanh",
                         query_pre_attn_scalar=256, attn_logit_softcapping=50.0,
                         final_logit_softcapping=30.0, sliding_window=4096,
                         tie_word_embeddings=True), 4096, ("gemma-2-9b", "gemma2_9b")),
    "gemma3-1b": (_llama(1152, 26, 4, 1, 6912, 262144, 1e6, model_type="gemma3_text",
                         head_dim=256, rms_norm_eps=1e-6, hidden_activation="gelu_pytorch_tanh",
                         query_pre_attn_scalar=256, sliding_window=512, max_position_embeddings=32768,
                         tie_word_embeddings=True), 4096, ("gemma-3-1b", "gemma3_1b")),
    "qwen3-30b-a3b": (_llama(2048, 48, 32, 4, 6144, 151936, 1e6, model_type="qwen3_moe", head_dim=128,
                             num_experts=128, num_experts_per_tok=8, moe_intermediate_size=768,
                             rms_norm_eps=1e-6, max_position_embeddings=40960,
                             tie_word_embeddings=False), 4096, ("qwen3-30b", "qwen3_30b_a3b")),
    "deepseek-v3": ({"model_type": "deepseek_v3", "hidden_size": 7168, "intermediate_size": 18432,
                     "moe_intermediate_size": 2048, "num_hidden_layers": 61, "num_attention_heads": 128,
                     "num_key_value_heads": 128, "n_routed_experts": 256, "n_shared_experts": 1,
                     "num_experts_per_tok": 8, "n_group": 8, "topk_group": 4,
                     "routed_scaling_factor": 2.5, "first_k_dense_replace": 3, "q_lora_rank": 1536,
                     "kv_lora_rank": 512, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
                     "v_head_dim": 128, "vocab_size": 129280, "rms_norm_eps": 1e-6,
                     "rope_theta": 10000.0, "max_position_embeddings": 163840,
                     "tie_word_embeddings": False}, 4096, ("deepseek_v3", "deepseek-r1")),
    # openai/gpt-oss-20b and -120b config.json (the experts as bf16, as HF runs them without the
    # MXFP4 kernels); their model cards: 21B and 117B parameters
    "gpt-oss-20b": (_llama(2880, 24, 64, 8, 2880, 201088, 150000.0, model_type="gpt_oss", head_dim=64,
                           num_local_experts=32, num_experts_per_tok=4, sliding_window=128,
                           attention_bias=True, max_position_embeddings=131072,
                           tie_word_embeddings=False), 4096, ("gpt_oss_20b", "gpt-oss")),
    "gpt-oss-120b": (_llama(2880, 36, 64, 8, 2880, 201088, 150000.0, model_type="gpt_oss", head_dim=64,
                            num_local_experts=128, num_experts_per_tok=4, sliding_window=128,
                            attention_bias=True, max_position_embeddings=131072,
                            tie_word_embeddings=False), 4096, ("gpt_oss_120b",)),
    "phi3-mini": (_llama(3072, 32, 32, 32, 8192, 32064, 10000.0, model_type="phi3",
                         max_position_embeddings=4096, tie_word_embeddings=False), 4096,
                  ("phi-3-mini", "phi3_mini", "phi-3-mini-4k")),
    "t5-base": ({"model_type": "t5", "d_model": 768, "d_ff": 3072, "d_kv": 64, "num_heads": 12,
                 "num_layers": 12, "vocab_size": 32128, "feed_forward_proj": "relu",
                 "dropout_rate": 0.1, "layer_norm_epsilon": 1e-6,
                 "relative_attention_num_buckets": 32}, 512, ("t5_base",)),
    "flan-t5-xl": ({"model_type": "t5", "d_model": 2048, "d_ff": 5120, "d_kv": 64, "num_heads": 32,
                    "num_layers": 24, "vocab_size": 32128, "feed_forward_proj": "gated-gelu",
                    "tie_word_embeddings": False, "dropout_rate": 0.1, "layer_norm_epsilon": 1e-6,
                    "relative_attention_num_buckets": 32}, 512, ("flan_t5_xl", "flan-t5-3b")),
    "switch-xl4": (_switch(1024, 16384, 128, 32, 24), 512, ("switchxl4", "switch-transformer-xl4")),
    "switch-base-4": (_switch(768, 3072, 64, 12, 12), 512, ("switch4", "switch-base4")),
    "dlrm": ({"model_type": "dlrm", "dense_features": 13, "bottom_mlp": [512, 256],
              "embedding_dim": 128, "table_rows": [1_000_000] * 26,
              "top_mlp": [1024, 1024, 512, 256], "pooling": 1}, 1, ("dlrm-criteo",)),
    "resnet50": ({"model_type": "resnet", "embedding_size": 64, "hidden_sizes": [256, 512, 1024, 2048],
                  "depths": [3, 4, 6, 3], "num_channels": 3, "num_labels": 1000, "image_size": 224},
                 1, ("resnet-50", "rn50")),
    "vgg16": ({"model_type": "vgg", "layers": [64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512,
                                               512, 512, "M", 512, 512, 512, "M"],
               "num_channels": 3, "num_labels": 1000, "image_size": 224}, 1, ("vgg-16",)),
    "vit-b16": ({"model_type": "vit", "hidden_size": 768, "num_hidden_layers": 12,
                 "num_attention_heads": 12, "intermediate_size": 3072, "patch_size": 16,
                 "image_size": 224, "num_channels": 3, "layer_norm_eps": 1e-6,
                 "hidden_dropout_prob": 0.0, "num_labels": 1000}, 1, ("vit-b-16", "vit-base-patch16-224")),
}


# What HF transformers builds for a key a config leaves out, where that is not what the kit reads
# otherwise (hidden / heads for head_dim, one KV head a query head, no sliding window, no experts):
# the class defaults of transformers 5.25's MistralConfig ... GptOssConfig. A config.json that HF
# saves writes them all; a hand-written dict may not, and HF builds it with these (a Gemma dict
# without head_dim is 256-wide heads, 16 heads over 3072: 134.5M parameters in a 4-layer test
# model, not the 84.2M of 192-wide heads). A key given as null keeps the kit's reading, one KV head a
# query head and hidden / heads, as HF 5.25 reads a null where it takes one (num_key_value_heads:
# Llama, Qwen2, Qwen3, Phi-3; head_dim: Llama, Mistral, Mixtral; its other classes refuse a null
# or fail to build, where the kit stays lenient). HF 4.51 had the same defaults. Families not listed (llama, phi3) default as the kit reads. Qwen's sliding_window and
# max_window_layers act only with use_sliding_window.
HF_DEFAULTS = {
    "mistral": {"num_key_value_heads": 8, "sliding_window": 4096},
    "mixtral": {"num_key_value_heads": 8, "num_local_experts": 8, "num_experts_per_tok": 2},
    "qwen2": {"num_key_value_heads": 32, "sliding_window": 4096, "max_window_layers": 28},
    "qwen3": {"head_dim": 128, "num_key_value_heads": 32, "sliding_window": 4096, "max_window_layers": 28},
    "qwen2_moe": {"num_key_value_heads": 16, "sliding_window": 4096, "max_window_layers": 28,
                  "num_experts_per_tok": 4, "moe_intermediate_size": 1408,
                  "shared_expert_intermediate_size": 5632},
    "qwen3_moe": {"num_key_value_heads": 4, "sliding_window": 4096, "num_experts_per_tok": 8,
                  "moe_intermediate_size": 768},
    "gemma": {"head_dim": 256, "num_key_value_heads": 16},
    "gemma2": {"head_dim": 256, "num_key_value_heads": 4, "sliding_window": 4096},
    "gemma3_text": {"head_dim": 256, "num_key_value_heads": 4, "sliding_window": 4096},
    "gpt_oss": {"head_dim": 64, "num_key_value_heads": 8, "sliding_window": 128,
                "num_local_experts": 128, "num_experts_per_tok": 4},
}


def hf_value(c: dict, key: str, fallback=None):
    """c[key] where the config has the key (null included); else HF's default for its model_type
    (HF_DEFAULTS); else fallback."""
    if key in c:
        return c[key]
    return HF_DEFAULTS.get(c.get("model_type", "llama"), {}).get(key, fallback)


def _norm(name: str) -> str:
    """Case and punctuation do not matter, but a decimal point does: "gpt3-1.3b" (1.3 billion)
    is not "gpt3-13b"; it reads as "p", as in "gpt3-2p7b"."""
    return re.sub(r"[^a-z0-9]", "", re.sub(r"(?<=\d)\.(?=\d)", "p", name.lower()))


_INDEX = {_norm(a): key for key, (_, _, aliases) in ZOO.items() for a in (key, *aliases)}


def zoo_names() -> list[str]:
    return list(ZOO)


def resolve(name: str) -> str:
    """Zoo key for a name or alias; KitError listing the zoo otherwise."""
    key = _INDEX.get(_norm(name)) if isinstance(name, str) else None
    if key is None:
        raise KitError(f"unknown model {name!r}: choose a zoo model ({', '.join(ZOO)}), "
                       "pass an HF-style config dict, or a Python path 'module:callable'")
    return key


def config(name: str) -> dict:
    return dict(ZOO[resolve(name)][0])


def default_seq(name: str) -> int:
    return ZOO[resolve(name)][1]
