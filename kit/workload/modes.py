"""What a captured step can be, and which models can take each: the modes of capture (train,
inference, decode) and the KV-cache kinds of a decode step (kit.workload.kv_cache). Kept apart
from the zoo and free of torch, so that checking a request imports neither."""
from __future__ import annotations

from kit.errors import KitError

MODES = ("train", "inference", "decode")
# the families the zoo's Llama-style decoder builds (kit.workload.zoo_modern)
LLAMA_FAMILIES = ("llama", "mistral", "mixtral", "qwen2", "qwen3", "qwen2_moe", "qwen3_moe", "gemma",
                  "gemma2", "gemma3_text", "phi3", "gpt_oss")
# of them, those whose LM head shares the token embedding unless tie_word_embeddings says not
# (HF's config defaults): the zoo's module (kit.workload.zoo_modern) and the multi-GPU layer's
# GPTSpec.tied read it here, without torch
TIED_BY_DEFAULT = ("gemma", "gemma2", "gemma3_text")
# of them, those whose HF attention ignores attention_bias (transformers 5.25's modeling files:
# Mistral, Mixtral and Phi-3 build their projections with bias=False, Qwen2 q, k, v with True and
# o with False, Qwen2-MoE q, k, v with its own qkv_bias)
FIXED_BIASES = ("mistral", "mixtral", "qwen2", "qwen2_moe", "phi3")


def linear_biases(c: dict) -> tuple[bool, bool, bool]:
    """Which linear layers of a Llama-family config have biases, as HF transformers 5.25 builds
    them: (q, k and v; the output projection o; the MLP's gate, up and down). attention_bias
    puts one on all four attention projections where HF's attention reads it (LlamaAttention,
    Qwen3's, Gemma 1-3's; GPT-OSS's is true by default); Qwen2's q, k and v always have one,
    Qwen2-MoE's as its qkv_bias says (true by default); mlp_bias, read by LlamaMLP alone, puts one
    on all three MLP projections. The zoo's module (kit.workload.zoo_modern) and the multi-GPU
    layer's GPTSpec read them here, without torch."""
    family = c.get("model_type", "llama")
    every = family not in FIXED_BIASES and bool(c.get("attention_bias", family == "gpt_oss"))
    qkv = every or family == "qwen2" or (family == "qwen2_moe" and bool(c.get("qkv_bias", True)))
    return qkv, every, family == "llama" and bool(c.get("mlp_bias"))


def sliding_windows(c) -> list[int]:
    """Per layer the sliding window its decode cache keeps (0: every token), as HF's configs
    type the layers: none in Llama and Gemma (their HF attention reads neither sliding_window nor
    layer_types); an explicit layer_types list; else Gemma 2 and GPT-OSS slide on even
    layers, Gemma 3 on all but every sliding_window_pattern-th (6), the Qwens only with
    use_sliding_window, layer_types or not (Qwen2 and Qwen3 from max_window_layers on, Qwen2-MoE
    on the even layers below it, Qwen3-MoE on all, its layer_types unread), any other family with a sliding_window on every layer. A
    window (or max_window_layers) the config leaves out is HF's default for its family (Mistral,
    Gemma 2 and 3: 4096; GPT-OSS 128; Qwen: 4096 from layer 28: zoo_configs.HF_DEFAULTS); a
    Mistral dict without one had decoded at 8k context over 8k keys a layer, HF's over 4,096.
    Here, free of torch, for the zoo's module (kit.workload.zoo_modern) and the multi-GPU
    layer's GPTSpec (kit.parallel.gpt_spec) alike."""
    from kit.workload.zoo_configs import hf_value

    n, w, family = c["num_hidden_layers"], hf_value(c, "sliding_window") or 0, c.get("model_type", "llama")
    if family.startswith("qwen") and not c.get("use_sliding_window"):
        # HF's Qwen configs null the window without use_sliding_window, whatever layer_types
        # says: a Qwen2 dict typing layers "sliding_attention" had kept HF's default 4096 there
        w = 0
    if not w or family in ("llama", "gemma"):
        return [0] * n
    _check_whole("sliding_window", w, "tokens a query sees; null or 0: none")
    if family == "qwen3_moe":  # its HF attention reads config.sliding_window, no layer_types
        return [w] * n
    types = c.get("layer_types")
    if types:
        # HF's PreTrainedConfig.validate_layer_type (transformers 5.25) refuses a list of another
        # length: read as given, a short one had windowed the model's other layers as its last
        # (multi-GPU) or left them unwindowed (zip, one GPU); a string had been read letter by letter
        if not isinstance(types, list) or len(types) != n or not all(isinstance(t, str) for t in types):
            raise KitError(f"layer_types must be a list of num_hidden_layers ({n}) attention kinds "
                           f"(\"sliding_attention\", \"full_attention\"), got {types!r}")
        return [w if t == "sliding_attention" else 0 for t in types]
    if family in ("gemma2", "gpt_oss"):
        return [w if i % 2 == 0 else 0 for i in range(n)]
    if family == "gemma3_text":
        pattern = c.get("sliding_window_pattern", 6)
        return [w if (i + 1) % pattern else 0 for i in range(n)]
    if family.startswith("qwen"):
        first = hf_value(c, "max_window_layers", n)
        _check_whole("max_window_layers", first, "the first sliding-window layer")
        slides = {"qwen2_moe": lambda i: i % 2 == 0 and i < first}.get(family, lambda i: i >= first)
        return [w if slides(i) else 0 for i in range(n)]
    return [w] * n


def _check_whole(key: str, value, what: str) -> None:
    """A KitError unless value is a whole number >= 0: a list or string had failed inside the
    reading with a TypeError (unhashable, '>=' between int and str)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise KitError(f"{key} must be a whole number ({what}), got {value!r}")


DECODERS = ("gpt2", "opt", *LLAMA_FAMILIES, "deepseek_v3")  # families with a KV-cache decode step
KV_CACHES = ("static", "dynamic")  # how a decode step's cache grows (kit.workload.kv_cache)


def decodes(model) -> bool:
    """Whether a zoo name or config is a decoder-only model with a KV-cache decode step."""
    from kit.workload.zoo import config

    cfg = config(model) if isinstance(model, str) else dict(model)
    return (cfg.get("model_type") or ("gpt2" if "n_embd" in cfg else None)) in DECODERS


def check_mode(model, mode: str, optimizer=None, kv_cache: str = "static") -> None:
    """KitError for a mode the model cannot run: an unknown one, an optimizer step outside
    training, a decode step of a model that is not a decoder with a KV cache, or a cache kind
    outside decoding."""
    if kv_cache not in KV_CACHES:
        raise KitError(f"unknown KV cache {kv_cache!r}: choose {', '.join(KV_CACHES)}")
    if kv_cache != "static" and mode not in ("decode", "generate"):
        raise KitError(f"a {kv_cache} KV cache is for decoding (mode decode or generate), not {mode}")
    if mode == "generate":
        raise KitError("mode generate is a prefill and many decode steps, not one graph: use "
                       "kit.api.predict_generation (CLI: kit predict --mode generate)")
    if mode not in MODES:
        raise KitError(f"unknown mode {mode!r}: choose {', '.join(MODES)}")
    if optimizer not in (None, "none") and mode != "train":
        raise KitError(f"an optimizer step needs mode train (got mode {mode})")
    if mode == "decode" and model is not None and not decodes(model):  # None: a user's module
        from kit.workload.zoo import config, resolve

        cfg = config(model) if isinstance(model, str) else dict(model)
        kind = cfg.get("model_type")
        name = resolve(model) if isinstance(model, str) else cfg.get("name", kind)
        raise KitError(f"mode decode (one generated token with a KV cache) needs a decoder-only "
                       f"model ({', '.join(DECODERS)}); {name} is a {kind} model")
