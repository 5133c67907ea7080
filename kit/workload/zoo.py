"""The model zoo: named configs (HF key names) built as plain-torch models, plus cached capture.

    model = build("gpt2-large")                 # an nn.Module on the meta device
    graph = graph_for("gpt3-2.7b", batch=2, seq=2048, mode="train")

Names are matched ignoring case and punctuation, and NeuSight's config names are aliases
(gpt2_large, gpt3_27, opt_13, bert_large, switchxl4, ...). Where NeuSight ships a config, the
zoo's matches it key for key (tests check this against $KIT_DATA/data/DLmodel_configs).
A user's own HF-style config dict works too: build({"model_type": "gpt2", "n_embd": ...}).

Captures are cached per model, shape, mode, dtype and optimizer: in-process (LRU) and on disk
as pickles under $KIT_CACHE/workload (default ~/.cache/gpu-perf-kit; disk=False opts out), so a
second process loads the graph without capturing and without importing torch. The key covers
the kit version and the capture code's files, so a change to either re-captures. An optimizer
given as a callable is keyed by its module and qualified name; one without a lasting name (a
lambda, closure or partial) is captured afresh on every call and cached nowhere.
"""
from __future__ import annotations

import hashlib
import json
import numbers
import os
import pickle
import re
from collections import OrderedDict
from pathlib import Path

from kit.errors import KitError, one_line
from kit.workload.modes import (DECODERS, KV_CACHES, LLAMA_FAMILIES, MODES, check_mode,  # noqa: F401
                                decodes)


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


FAMILIES = {"gpt2": "GPT2LMHeadModel", "bert": "BertForPreTraining", "opt": "OPTForCausalLM",
            **{f: "LlamaForCausalLM" for f in LLAMA_FAMILIES}, "deepseek_v3": "DeepseekV3ForCausalLM",
            "switch_transformers": "SwitchTransformer", "t5": "SwitchTransformer", "dlrm": "DLRM", "resnet": "ResNet",
            "vgg": "VGG", "vit": "ViT"}


def build(model: str | dict):
    """An nn.Module on the meta device, from a zoo name or an HF-style config dict."""
    import torch

    from kit.workload import zoo_deepseek, zoo_dlrm, zoo_models, zoo_modern, zoo_t5, zoo_vision

    cfg = config(model) if isinstance(model, str) else dict(model)
    kind = cfg.get("model_type")
    if kind is None and "n_embd" in cfg:
        kind = "gpt2"
    if kind not in FAMILIES:
        inner = cfg.get("text_config")
        if isinstance(inner, dict) and inner.get("model_type") in FAMILIES:  # Gemma 3, Llava, ...
            raise KitError(f"config model_type {kind!r} is multimodal: its language model is the "
                           f"text_config inside it (model_type {inner['model_type']!r}); pass that "
                           "dict to predict the text model (the vision tower is not built)")
        raise KitError(f"config model_type {kind!r} is not supported: choose one of {', '.join(FAMILIES)}")
    _check_sizes(kind, cfg)
    modules = (zoo_models, zoo_modern, zoo_deepseek, zoo_t5, zoo_dlrm, zoo_vision)
    cls = next(getattr(m, FAMILIES[kind]) for m in modules if hasattr(m, FAMILIES[kind]))
    try:
        with torch.device("meta"):
            return cls(cfg)
    except KeyError as e:
        raise KitError(f"{kind} config is missing key {e.args[0]!r}") from None
    except (RuntimeError, TypeError, ValueError, ZeroDivisionError) as e:  # n_embd -5, "64", ...
        raise KitError(f"{kind} config cannot build a model: {one_line(e, with_type=False)}") from None


# config fields that count something a model must have at least one of (layers, widths, heads,
# vocabulary, experts, table rows); 0 built an empty model that predicted a few µs
SIZE_FIELDS = ("n_layer", "num_hidden_layers", "num_layers", "num_decoder_layers", "n_embd",
               "hidden_size", "d_model", "d_ff", "d_kv", "ffn_dim", "intermediate_size", "n_inner",
               "n_head", "num_attention_heads", "num_heads", "num_key_value_heads", "head_dim",
               "vocab_size", "n_positions", "max_position_embeddings", "num_experts",
               "num_local_experts", "num_experts_per_tok", "embedding_dim", "dense_features",
               "pooling", "bottom_mlp", "top_mlp", "table_rows", "embedding_size", "hidden_sizes",
               "depths", "num_labels", "image_size", "patch_size", "num_channels", "layers",
               "classifier_size")


def _check_sizes(kind: str, cfg: dict) -> None:
    """A KitError for a size that is not a positive whole number: 0, negative, fractional, a bool
    (JSON true is not 1 layer), a string, or an empty list of them. A list may hold markers
    (vgg's "M" for a max-pool) beside its sizes."""
    for name in SIZE_FIELDS:
        value = cfg.get(name)
        if value is None:
            continue
        many = isinstance(value, (list, tuple))
        items = [v for v in value if not isinstance(v, str)] if many else [value]
        bad = (many and not value) or any(isinstance(v, bool) or not isinstance(v, numbers.Integral)
                                          or v < 1 for v in items)  # numpy integers are whole
        if bad:
            raise KitError(f"{kind} config cannot build a model: {name} must be "
                           f"{'a list of ' if many else 'a '}positive whole number"
                           f"{'s' if many else ''}, got {value!r}")
    whole, parts = HEAD_SPLITS.get(kind, (None, None))
    if kind in LLAMA_FAMILIES and cfg.get("head_dim") is not None:  # heads of a size of their own
        whole = None
    if isinstance(cfg.get(whole), int) and isinstance(cfg.get(parts), int) and cfg[whole] % cfg[parts]:
        raise KitError(f"{kind} config cannot build a model: {whole} {cfg[whole]} must be a "
                       f"multiple of {parts} {cfg[parts]} (each attention head gets an equal share)")


# the width these families split evenly into attention heads (they have no head_dim of their own)
HEAD_SPLITS = {"gpt2": ("n_embd", "n_head"), "bert": ("hidden_size", "num_attention_heads"),
               "opt": ("hidden_size", "num_attention_heads"),
               **{f: ("hidden_size", "num_attention_heads") for f in LLAMA_FAMILIES}}  # no head_dim


# -- cached capture -----------------------------------------------------------------------------
_LRU: OrderedDict = OrderedDict()
LRU_SIZE = 32


def cache_dir() -> Path:
    return Path(os.environ.get("KIT_CACHE") or Path.home() / ".cache" / "gpu-perf-kit") / "workload"


def _optimizer_name(optimizer):
    """An optimizer as it goes into a cache key: a name as it is, a callable(params) by its
    module and qualified name (torch.optim.SGD, mypkg.opt:make), or None for a callable whose
    name does not say what it builds (a lambda, a closure, a functools.partial, a bound method,
    a callable object, anything defined in __main__): captures with those are never cached."""
    if optimizer is None or isinstance(optimizer, str):
        return optimizer
    import inspect

    module = getattr(optimizer, "__module__", None)
    qualname = getattr(optimizer, "__qualname__", None)
    named = inspect.isfunction(optimizer) or inspect.isclass(optimizer)
    if not named or not module or module == "__main__" or not qualname or "<" in qualname:
        return None
    return f"{module}:{qualname}"


def _key(model, batch, seq, mode, dtype, optimizer) -> str:
    from kit import __version__

    ident = resolve(model) if isinstance(model, str) else json.dumps(model, sort_keys=True, default=str)
    raw = json.dumps([ident, batch, seq, mode, dtype, _optimizer_name(optimizer), __version__,
                      _code_stamp()], default=str)
    return hashlib.sha256(raw.encode()).hexdigest()[:24]


def _code_stamp() -> str:
    """Changes whenever the capture code or the models change (invalidates disk caches)."""
    here = Path(__file__).parent
    names = ("capture.py", "capture_roots.py", "capture_errors.py", "recorder.py", "gpu_kernels.py",
             "mapping.py", "mapping_gemm.py", "kernels.py", "modes.py", "zoo.py", "zoo_models.py", "zoo_modern.py",
             "zoo_deepseek.py", "zoo_experts.py", "zoo_t5.py", "zoo_dlrm.py", "zoo_vision.py", "mapping_vision.py",
             "mapping_elementwise.py", "graph.py", "fast_path.py", "rnn_capture.py", "hf_compat.py",
             "replicate.py", "kv_cache.py", "../ops.py")  # ops.py: the pickled ops' classes
    return "-".join(str(int((here / n).stat().st_mtime)) for n in names if (here / n).exists())


def lm_loss(vocab: int):
    """The training loss of a language model, as HF's ForCausalLMLoss and a Megatron-free
    training script compute it: the logits upcast to fp32, then cross-entropy (log-softmax and
    the NLL mean) against integer labels. An output whose last dimension is not the vocabulary
    (a pooled classifier, an encoder's hidden states) is returned as it is: no loss is made up."""
    import torch
    import torch.nn.functional as F

    def loss(logits):
        if logits.dim() < 2 or logits.shape[-1] != vocab:
            return logits
        flat = logits.float().reshape(-1, vocab)
        labels = torch.empty(flat.shape[0], dtype=torch.long, device=flat.device)  # the batch's labels
        return F.cross_entropy(flat, labels)

    return loss


def graph_for(model: str | dict, batch: int, seq: int | None = None, mode: str = "train",
              dtype: str = "fp32", optimizer: str | None = None, disk: bool | None = None,
              kv_cache: str = "static", loss: bool = True, last_logits: bool = False):
    """The captured OpGraph of a zoo model / config for one shape, cached. kv_cache: how a
    decode step's cache grows, "static" or "dynamic" (kit.workload.kv_cache). loss: a training
    step of a language model ends its forward pass with the cross-entropy over the vocabulary
    (lm_loss) and starts its backward there; False starts it at the logits, as NeuSight's
    labels were measured (kit validate). last_logits: an inference pass computes the logits of
    each sequence's last position only, as generation's prefill does (HF generate's
    logits_to_keep=1, serving engines): the LM head reads one row a sequence."""
    _check_positive(batch=batch)
    if isinstance(model, dict):  # its sizes before a default seq is read off them
        _check_sizes(model.get("model_type", "gpt2"), model)
    if seq is None:  # a config: 512, or its learned position table if that is shorter
        seq = default_seq(model) if isinstance(model, str) else min(512, max_seq(model) or 512)
        limit = max_seq(model)
        if mode == "decode" and limit and seq >= limit:  # the default context leaves the new token a position
            seq = limit - 1
    _check_positive(seq=seq)
    check_tokens(batch, seq if uses_seq(model) else None)
    check_mode(model, mode, optimizer, kv_cache)
    check_seq(model, seq, 1 if mode == "decode" else 0)  # decode: the context and the new token
    captured = f"decode:{kv_cache}" if mode == "decode" else mode
    loss = bool(loss) and mode == "train"
    last_logits = bool(last_logits) and mode == "inference"
    if optimizer is not None and _optimizer_name(optimizer) is None:
        # a lambda, closure or partial: its name does not say what it builds (two lambdas share
        # one), in this process or the next, so the capture is neither cached nor keyed
        return _capture(model, batch, seq, captured, dtype, optimizer, loss, last_logits)
    key = _key(model, batch, seq, captured + (":loss" if loss else "") + (":last" if last_logits else ""),
               dtype, optimizer)
    if key in _LRU:
        _LRU.move_to_end(key)
        return _LRU[key]
    use_disk = True if disk is None else disk
    path = cache_dir() / f"{key}.pkl"
    graph = None
    if use_disk and path.exists():
        try:
            graph = pickle.loads(path.read_bytes())
        except (pickle.UnpicklingError, EOFError, AttributeError, ImportError):
            graph = None
    if graph is None:
        graph = _capture(model, batch, seq, captured, dtype, optimizer, loss, last_logits)
        if use_disk:
            _write(path, graph)
    graph.meta["cache_key"] = key  # kit.workload.latency_cache keys predictions on it
    _LRU[key] = graph
    while len(_LRU) > LRU_SIZE:
        _LRU.popitem(last=False)
    return graph


def _write(path: Path, graph) -> None:
    """Pickle a capture (or any cached result) atomically; an unwritable cache is skipped, never
    an error."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_bytes(pickle.dumps(graph, protocol=pickle.HIGHEST_PROTOCOL))
        tmp.replace(path)
    except OSError:
        pass


LAYER_KEYS = ("n_layer", "num_hidden_layers")  # families whose layers are all alike
REPLICABLE = {"gpt2", "bert", "opt", "deepseek_v3", *LLAMA_FAMILIES}


def _last_position(module, args):
    """A forward pre-hook for the LM head: only each sequence's last position (a view)."""
    return (args[0][..., -1:, :], *args[1:])


def _capture(model, batch, seq, mode, dtype, optimizer, loss=False, last_logits=False):
    """Capture; for models of identical layers, capture three and repeat the middle one
    (kit.workload.replicate: the same graph, a fraction of the time)."""
    from kit.workload.capture import capture, capture_optimizer
    from kit.workload.replicate import expand_layers, leading_layers

    # a config without a name is not the zoo model of its type (a 4-layer gpt2 is no "gpt2")
    name = resolve(model) if isinstance(model, str) else \
        model.get("name", f"{model.get('model_type', 'model')} config")
    cfg = config(model) if isinstance(model, str) else dict(model)
    layer_key = next((k for k in LAYER_KEYS if k in cfg), None)
    n_layers = cfg.get("n_layer") or cfg.get("num_hidden_layers") or cfg.get("num_layers")
    meta = {"batch": batch, "seq": seq if uses_seq(cfg) else None,  # DLRM, CNNs read no sequence
            "config": cfg, "n_layers": n_layers}
    vocab = cfg.get("vocab_size")
    loss_fn = lm_loss(vocab) if loss and mode == "train" and isinstance(vocab, int) else None
    meta["loss"] = "cross-entropy" if loss_fn is not None else None
    full = build(cfg)
    if last_logits and hasattr(full, "lm_head"):
        full.lm_head.register_forward_pre_hook(_last_position)
        meta["last_logits"] = True
    if mode.startswith("decode"):  # one new token per sequence, `seq` tokens in the KV cache
        from kit.workload.capture import TORCH_DTYPES
        from kit.workload.kv_cache import cache_bytes

        kind = mode.partition(":")[2] or "static"
        inputs = full.decode_inputs(batch, seq, kind)
        meta.update(mode="decode", context=seq, kv_cache=kind,
                    kv_cache_bytes=cache_bytes(inputs[1], TORCH_DTYPES.get(dtype)))
        mode = "inference"  # captured as a forward pass without gradients
    else:
        inputs = full.example_inputs(batch, seq)
    # a decode step whose layers keep caches of different lengths (sliding windows on some
    # layers only, past the window) has layers that differ: no layer can stand for the others
    caches = {tuple(c.keys.shape) for c in inputs[1]} if meta.get("mode") == "decode" else set()
    # likewise a prefill whose sliding layers get a window mask (seq >= window) and the others not
    masks = ({w if w and seq >= w else 0 for w in full.windows}
             if meta.get("mode") != "decode" and hasattr(full, "windows") else set())
    first = leading_layers(full, n_layers) if isinstance(n_layers, int) else None
    if (cfg.get("model_type", "gpt2") in REPLICABLE and layer_key and first is not None
            and n_layers > first + 3 and (optimizer is None or mode == "train")
            and len(caches) <= 1 and len(masks) <= 1):
        few = build({**cfg, layer_key: first + 3})
        if meta.get("last_logits"):
            few.lm_head.register_forward_pre_hook(_last_position)
        small = capture(few, inputs, mode=mode, dtype=dtype, name=name, meta=meta, loss=loss_fn)
        graph = expand_layers(small, n_layers, first)
        if graph is not None:
            per_layer = small.meta["saved_bytes_by_layer"].get(first + 1, 0)
            params = {id(p): p for p in full.parameters()}
            n_params = sum(p.numel() for p in params.values())
            n_buffers, few_buffers = (sum(b.numel() for b in m.buffers()) for m in (full, few))
            n_trainable = sum(p.numel() for p in params.values() if p.requires_grad)
            graph.meta.update(params=n_params, param_bytes=n_params * small.meta["param_bytes"]
                              // max(small.meta["params"], 1),
                              trainable_param_bytes=n_trainable * small.meta["param_bytes"]
                              // max(small.meta["params"], 1),
                              buffer_bytes=n_buffers * small.meta["buffer_bytes"] // max(few_buffers, 1),
                              activation_bytes=small.meta["activation_bytes"]
                              + (n_layers - first - 3) * per_layer
                              if mode == "train" else small.meta["activation_bytes"],
                              replicated_from=first + 3, optimizer=optimizer)
            if optimizer is not None:
                graph = _with_optimizer(graph, capture_optimizer(full, optimizer, dtype))
            return graph
    return capture(full, inputs, mode=mode, optimizer=optimizer, dtype=dtype, name=name, meta=meta,
                   loss=loss_fn)


def _with_optimizer(graph, opt_nodes):
    """Append an optimizer step after the backward pass (its first node waits for the last
    backward node: the gradients are complete)."""
    from dataclasses import replace

    base = len(graph.nodes)
    last = base - 1
    nodes = list(graph.nodes)
    for n in opt_nodes:
        deps = tuple(d + base for d in n.deps) or ((last,) if n.id == opt_nodes[0].id else ())
        nodes.append(replace(n, id=n.id + base, deps=deps))
    return graph.with_nodes(nodes)


def _check_positive(**values):
    for k, v in values.items():
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise KitError(f"{k} must be a positive whole number, got {v!r}")


# tokens (samples) a step may hold: 2^40, past any GPU's memory by orders of magnitude, and
# far enough under int64 that a step's example tensors ([batch, seq, hidden], the logits) are
# sized without overflow (past it torch raised its own errors before the capture began)
MAX_TOKENS = 2**40


def check_tokens(batch: int, seq: int | None = None) -> None:
    """A KitError when batch x seq is past MAX_TOKENS."""
    if batch * (seq or 1) > MAX_TOKENS:
        what = f"batch {batch:,} x seq {seq:,} is {batch * seq:.3g} tokens" if seq else \
            f"batch {batch:,} is {batch:.3g} samples"
        raise KitError(f"{what} a step, more than any GPU holds (at most 2^40); give a smaller "
                       f"--batch{' or --seq' if seq else ''}")


# families that read no sequence, and what they read instead (a seq would change nothing)
NO_SEQUENCE = {"dlrm": "dense features and sparse ids per sample",
               "resnet": "images of the config's image_size", "vgg": "images of the config's image_size",
               "vit": "images of the config's image_size"}


def uses_seq(model) -> bool:
    """Whether a zoo name or config reads a sequence (DLRM and the vision models do not)."""
    return inputs_instead_of_seq(model) is None


def inputs_instead_of_seq(model) -> str | None:
    """What a model that reads no sequence reads instead ("images of ..."); None if it reads one."""
    cfg = config(model) if isinstance(model, str) else dict(model)
    return NO_SEQUENCE.get(cfg.get("model_type"))


# families whose positions are a learned table (nn.Embedding): a longer sequence has no row to read
LEARNED_POSITIONS = {"gpt2": "n_positions", "bert": "max_position_embeddings",
                     "opt": "max_position_embeddings"}


def _position_table(model) -> tuple[str, str, int] | None:
    """(model name, config field, rows) of a model's learned position table, or None."""
    cfg = config(model) if isinstance(model, str) else dict(model)
    kind = cfg.get("model_type", "gpt2")
    field = LEARNED_POSITIONS.get(kind)
    if field is None:
        return None
    limit = cfg.get(field, 1024 if kind == "gpt2" else 512 if kind == "bert" else 2048)
    if not isinstance(limit, int):
        return None
    return (resolve(model) if isinstance(model, str) else cfg.get("name", kind)), field, limit


def max_seq(model) -> int | None:
    """The longest sequence a model can read: the rows of its learned position table (GPT-2's
    n_positions, BERT's and OPT's max_position_embeddings); None for rotary models (Llama,
    Mixtral) and the others, which have no such table."""
    table = _position_table(model)
    return table[2] if table else None


def check_seq(model, seq: int, new_tokens: int = 0) -> None:
    """KitError when seq (and, for decoding, the new tokens after it) exceeds the model's learned
    position table (max_seq)."""
    table = _position_table(model)
    if table and seq + new_tokens > table[2]:
        name, field, limit = table
        if new_tokens >= limit:  # no --seq helps: the new tokens alone take every position
            raise KitError(f"{new_tokens} new tokens alone need more than {name}'s {limit} learned "
                           f"positions ({field}), whatever the prompt; generate at most {limit - 1} "
                           f"(--new-tokens), or use a config with a larger {field}")
        if new_tokens:
            raise KitError(f"{seq} tokens and {new_tokens} new need {seq + new_tokens} positions, more "
                           f"than {name}'s {limit} learned positions ({field}); give a seq of "
                           f"{limit - new_tokens} or less (--seq), or a config with a larger {field}")
        raise KitError(f"seq {seq} is longer than {name}'s {limit} learned positions ({field}); "
                       f"give a seq of {limit} or less (--seq), or a config with a larger {field}")
