"""Checks of what a zoo model or a user's config is asked to do, before anything is built or
captured: config sizes (positive whole numbers; heads that split the width), a step's tokens,
and sequences against a learned position table."""
from __future__ import annotations

import numbers

from kit.errors import KitError
from kit.workload.modes import LLAMA_FAMILIES
from kit.workload.zoo_configs import config, hf_value, resolve


# config fields that count something a model must have at least one of (layers, widths, heads,
# vocabulary, experts, table rows); 0 built an empty model that predicted a few µs
SIZE_FIELDS = ("n_layer", "num_hidden_layers", "num_layers", "num_decoder_layers", "n_embd",
               "hidden_size", "d_model", "d_ff", "d_kv", "ffn_dim", "intermediate_size", "n_inner",
               "word_embed_proj_dim",
               "n_head", "num_attention_heads", "num_heads", "num_key_value_heads", "head_dim",
               "vocab_size", "n_positions", "max_position_embeddings", "num_experts",
               "num_local_experts", "num_experts_per_tok", "embedding_dim", "dense_features",
               "pooling", "bottom_mlp", "top_mlp", "table_rows", "embedding_size", "hidden_sizes",
               "depths", "num_labels", "image_size", "patch_size", "num_channels", "layers",
               "classifier_size")


# sizes only some families read: BERT builds its token-type table (0 rows had named another op);
# DeBERTa-v2 ships type_vocab_size 0, and is named unsupported rather than for this field
FAMILY_SIZE_FIELDS = {"bert": ("type_vocab_size",)}
LAYER_FIELDS = ("n_layer", "num_hidden_layers", "num_layers", "num_decoder_layers")
MAX_LAYERS = 4096  # DeepNet (Wang et al., 2022) trained 1,000-layer encoders, 2,500 sublayers at most


def _check_sizes(kind: str, cfg: dict) -> None:
    """A KitError for a size that is not a positive whole number: 0, negative, fractional, a bool
    (JSON true is not 1 layer), a string, or an empty list of them. VGG's layers may hold its
    max-pool marker "M" beside its widths; no other list may. A model_type that is no string,
    and more than MAX_LAYERS layers, are refused too."""
    if not isinstance(kind, str):  # a list or dict had raised "unhashable type" from a lookup
        raise KitError(f"config model_type must be a string such as 'gpt2', got {kind!r}")
    for name in (*SIZE_FIELDS, *FAMILY_SIZE_FIELDS.get(kind, ())):
        value = cfg.get(name)
        if value is None:
            continue
        many = isinstance(value, (list, tuple))
        pools = kind == "vgg" and name == "layers"  # the one list with a marker among its sizes
        items = [v for v in value if not (pools and v == POOL_MARKER)] if many else [value]
        bad = (many and not value) or any(isinstance(v, bool) or not isinstance(v, numbers.Integral)
                                          or v < 1 for v in items)  # numpy integers are whole
        if bad:  # a marker other than "M" ("X") had reached nn.Conv2d as a width: "not all
            # arguments converted during string formatting"; an "M" in DLRM's bottom_mlp had
            # reached torch.empty ("argument 'size' must be tuple of ints")
            raise KitError(f"{kind} config cannot build a model: {name} must be "
                           f"{'a list of ' if many else 'a '}positive whole number"
                           f"{'s' if many else ''}{f' (and {POOL_MARKER!r} for a max pool)' if pools else ''}"
                           f", got {value!r}")
    if kind == "vgg":
        _check_pools(cfg)
    for name in LAYER_FIELDS:
        if isinstance(cfg.get(name), numbers.Integral) and cfg[name] > MAX_LAYERS:
            raise KitError(f"{kind} config: {name} {cfg[name]:,} is more than the {MAX_LAYERS:,} layers "
                           "the kit captures (the deepest published transformers have 1,000-2,500 "
                           "sublayers; capturing grows with the layers, minutes past a few thousand)")
    whole, parts = HEAD_SPLITS.get(kind, (None, None))
    if kind in LLAMA_FAMILIES and hf_value(cfg, "head_dim") is not None:  # heads of a size of their own
        whole = None
    if isinstance(cfg.get(whole), int) and isinstance(cfg.get(parts), int) and cfg[whole] % cfg[parts]:
        raise KitError(f"{kind} config cannot build a model: {whole} {cfg[whole]} must be a "
                       f"multiple of {parts} {cfg[parts]} (each attention head gets an equal share)")
    if kind in LLAMA_FAMILIES:
        _check_rotary(kind, cfg)
    _check_sparse_layout(kind, cfg)


POOL_MARKER = "M"  # a VGG layers entry: a 2x2 max pool


def _check_pools(cfg: dict) -> None:
    """A VGG's images must outlast its 2x2 max pools: a 16-pixel image is 1x1 before the fifth
    pool of configuration D, which had failed inside the capture, blamed on the inputs."""
    pools, size = list(cfg.get("layers") or ()).count(POOL_MARKER), cfg.get("image_size", 224)
    if isinstance(size, int) and not isinstance(size, bool) and size >> pools < 1:
        raise KitError(f"vgg config cannot build a model: image_size {size} is halved by "
                       f"{pools} max pools ('M' in layers) to nothing; give an image_size of at "
                       f"least {2 ** pools}")


def _check_rotary(kind: str, cfg: dict) -> None:
    """The rotary families' checks: a head size that splits into the rotated pairs (an odd
    head_dim 7 had failed inside the capture, blamed on the inputs), so does Phi-3's rotated
    share of it (partial_rotary_factor), and a sliding window of
    whole tokens (null or 0: none; a window of -4 had been priced as a full-square mask)."""
    heads, hidden = cfg.get("num_attention_heads"), cfg.get("hidden_size")
    head = hf_value(cfg, "head_dim")  # HF's default where left out (Gemma 256)
    if head is None and isinstance(hidden, int) and isinstance(heads, int) and heads:
        head = hidden // heads
    if isinstance(head, int) and head % 2:
        raise KitError(f"{kind} config cannot build a model: a head of {head} (head_dim, or "
                       "hidden_size / num_attention_heads) must be even, rotary embeddings turn "
                       "its dimensions in pairs")
    factor = cfg.get("partial_rotary_factor")
    if kind == "phi3" and factor is not None and isinstance(head, int):  # Phi-4-mini: 0.75 of 128
        if isinstance(factor, bool) or not isinstance(factor, numbers.Real) or not 0 < factor <= 1:
            raise KitError(f"{kind} config cannot build a model: partial_rotary_factor must be a "
                           f"share of the head above 0 and at most 1, got {factor!r}")
        if int(head * factor) % 2 or int(head * factor) < 2:
            raise KitError(f"{kind} config cannot build a model: partial_rotary_factor {factor} turns "
                           f"{int(head * factor)} of a head's {head} dimensions; rotary embeddings "
                           "turn them in pairs, so that must be even")
    window = cfg.get("sliding_window")
    if window is not None and (isinstance(window, bool) or not isinstance(window, numbers.Integral)
                               or window < 0):
        raise KitError(f"{kind} config cannot build a model: sliding_window must be a whole number "
                       f"of tokens (null or 0: no window), got {window!r}")


# the width these families split evenly into attention heads (they have no head_dim of their own)
HEAD_SPLITS = {"gpt2": ("n_embd", "n_head"), "bert": ("hidden_size", "num_attention_heads"),
               "opt": ("hidden_size", "num_attention_heads"),
               **{f: ("hidden_size", "num_attention_heads") for f in LLAMA_FAMILIES}}  # no head_dim




def _check_positive(**values):
    for k, v in values.items():
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise KitError(f"{k} must be a positive whole number, got {v!r}")


# tokens (samples) a step may hold: 2^40, past any GPU's memory by orders of magnitude, and
# far enough under int64 that a step's example tensors ([batch, seq, hidden], the logits) are
# sized without overflow (past it torch raised its own errors before the capture began)
MAX_TOKENS = 2**40


def check_tokens(batch: int, seq: int | None = None, decode: bool = False) -> None:
    """A KitError when batch x seq is past MAX_TOKENS. A decode step (decode) computes `batch`
    new tokens; what grows past any GPU is its KV cache, batch x seq (the context) positions."""
    if batch * (seq or 1) > MAX_TOKENS:
        if decode and seq:  # batch 1e12 at context 1,023: 1e12 new tokens, 1.02e15 cached
            what = (f"batch {batch:,} x context {seq:,} is {batch * seq:.3g} tokens in the decode "
                    f"step's KV cache (the step adds {batch:,} new ones)")
        elif seq:
            what = f"batch {batch:,} x seq {seq:,} is {batch * seq:.3g} tokens a step"
        else:
            what = f"batch {batch:,} is {batch:.3g} samples a step"
        flags = (" or --seq (the context)" if decode else " or --seq") if seq else ""
        raise KitError(f"{what}, more than any GPU holds (at most 2^40); give a smaller --batch{flags}")


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


_NOTED_POSITIONS: set = set()  # (model, limit) noted once a process: generation asks per step


def _note_past_trained_positions(model, context: int) -> None:
    """A note (not an error: rotary positions have no table to run out of, and the kernels' time
    is priced all the same) when a model with a max_position_embeddings is given a longer
    context (a decode step's one new token after a full context is not counted: the zoo's
    default decode context is the trained length). One note per model and process, however
    many lengths pass it."""
    import warnings

    cfg = config(model) if isinstance(model, str) else dict(model)
    limit = cfg.get("max_position_embeddings")
    if isinstance(limit, int) and not isinstance(limit, bool) and context > limit:
        name = resolve(model) if isinstance(model, str) else cfg.get("name", cfg.get("model_type", "model"))
        if (name, limit) in _NOTED_POSITIONS:
            return
        _NOTED_POSITIONS.add((name, limit))
        warnings.warn(f"{name} was trained to {limit} positions (max_position_embeddings) and is "
                      f"asked for more: its time is priced at the length given, but the model "
                      "was not made for it")


def check_seq(model, seq: int, new_tokens: int = 0) -> None:
    """KitError when seq (and, for decoding, the new tokens after it) exceeds the model's learned
    position table (max_seq)."""
    table = _position_table(model)
    if table is None:
        _note_past_trained_positions(model, seq)
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


# which blocks hold experts: counts and steps where 0 means none (Switch), steps of at least 1
# where HF divides by them (Qwen-MoE: (i + 1) % decoder_sparse_step), and Qwen's dense layers
SPARSE_COUNTS = {"switch_transformers": ("num_sparse_encoder_layers", "num_sparse_decoder_layers",
                                         "encoder_sparse_step", "decoder_sparse_step")}
SPARSE_STEPS = {"qwen2_moe": ("decoder_sparse_step",), "qwen3_moe": ("decoder_sparse_step",)}


def _check_sparse_layout(kind: str, cfg: dict) -> None:
    """A KitError naming a sparse-layer field that is no whole number: a step of -1 or 2.5 had
    built a Switch model with no or other sparse blocks, silently; "2", a Qwen-MoE step of 0 and
    an mlp_only_layers of 3 had been named by Python's messages ("'>' not supported", "integer
    modulo by zero", "'int' is not iterable")."""
    for name, least in [*((n, 0) for n in SPARSE_COUNTS.get(kind, ())),
                        *((n, 1) for n in SPARSE_STEPS.get(kind, ()))]:
        v = cfg.get(name)
        if v is not None and (isinstance(v, bool) or not isinstance(v, numbers.Integral) or v < least):
            raise KitError(f"{kind} config cannot build a model: {name} must be a whole number of at "
                           f"least {least}{' (0: no sparse blocks)' if least == 0 else ''}, got {v!r}")
    dense = cfg.get("mlp_only_layers")
    if kind in SPARSE_STEPS and dense is not None and (
            not isinstance(dense, (list, tuple)) or any(
                isinstance(i, bool) or not isinstance(i, numbers.Integral) or i < 0 for i in dense)):
        raise KitError(f"{kind} config cannot build a model: mlp_only_layers must be a list of layer "
                       f"indices (whole numbers from 0), got {dense!r}")
