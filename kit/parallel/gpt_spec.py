"""GPT-style transformer shapes: GPTSpec, and parse_model, which reads an inline shape
(`gpt:layers=..,hidden=..,heads=..`) or a GPT-style zoo name into one. The kernels a layer runs
are kit.parallel.gpt's."""
from __future__ import annotations

import math
import re
from dataclasses import dataclass

from kit.errors import KitError


@dataclass(frozen=True)
class GPTSpec:
    layers: int
    hidden: int
    heads: int
    seq: int = 2048
    vocab: int = 51200
    ffn: int | None = None  # default 4·hidden
    kv_heads: int | None = None  # grouped-query attention (default: heads)
    experts: int = 0  # MoE experts per MoE layer (0: dense)
    moe_every: int = 2  # every n-th layer is MoE
    topk: int = 2
    capacity_factor: float | None = None  # MoE expert capacity (Switch, Fedus et al. 2021; GShard):
    # each expert takes ceil(capacity_factor x tokens x topk / experts) rows, its buffer padded to
    # that (or its overflow dropped). None: dropless routing, perfectly balanced (tokens x topk rows)
    gated: bool = False  # SwiGLU MLP (Llama, Mixtral): gate and up projections, then down
    rope: bool = False  # rotary positions (Llama, Mixtral): no learned position table, and (unless
    # `tied` says otherwise) an output projection of its own instead of the tied embedding
    tied: bool | None = None  # the LM head shares the token embedding (HF tie_word_embeddings);
    # None: as rope says (GPT-2 ties them, Llama does not). Llama 3.2 1B/3B and Qwen2.5 0.5-3B tie
    # them with rotary positions: an untied copy had counted their vocab x hidden twice
    positions: int | None = None  # rows of the learned position table (GPT-2's n_positions);
    # None: seq. A run at a shorter seq keeps the model's whole table (gpt2 at seq 128 had lost
    # 896 x 768 parameters from its weights, gradients and optimizer state)
    attention: str = "flash"  # "flash" (fused) | "unfused" (bmm, softmax, dropout, bmm)
    bias: bool | None = None  # biases on the linear layers (QKV, output projection, MLP or
    # experts: what qkv_bias, out_bias and mlp_bias say where given) and LayerNorm's beta; False:
    # none, and RMSNorm's weight alone for the norms (Llama,
    # Mistral, Mixtral; Megatron's --disable-bias-linear --normalization RMSNorm). None: as
    # gated says (GPT-2/3 and OPT have them, the SwiGLU families do not). The kit had counted
    # them for every model: Llama-3-8B's layer 218,155,008 parameters where its module has
    # 218,112,000 (4h attention, f + h MLP and 2h norm biases it has none of)
    qkv_bias: bool | None = None  # the QKV projection's bias alone (Qwen2: bias=False with
    # qkv_bias=True, h + 2·kv_heads·head_dim); None: as bias says
    out_bias: bool | None = None  # the attention output projection's bias (h); None: as bias says.
    # A Llama config's attention_bias puts one on o as on q, k and v (HF LlamaAttention): it had
    # been left out, h a layer, while bias said False for the RMSNorms
    mlp_bias: bool | None = None  # the MLP's (or each expert's) biases: f on each column-parallel
    # projection, h on the down projection; None: as bias says. A Llama config's mlp_bias (HF
    # LlamaMLP: gate, up and down) had been left out, 2f + h a layer
    dropout: float | None = None  # the hidden, embedding and attention dropouts' probability
    # (Megatron's --hidden-dropout and --attention-dropout, 0.1 by default, 0 in its Llama
    # recipes); None: 0 for a gated (Llama-style) model, else 0.1. At 0 torch's dropout returns
    # its input: no kernel and no mask (at::dropout), which the kit had run and kept for Llama too
    qk_norm: bool = False  # a norm over each head of q and k before the rotary positions
    # (Qwen3, Gemma 3: RMSNorm; Megatron-core's --qk-layernorm, of the layer's norm kind, so a
    # LayerNorm where the spec has biases): 2 x head_dim weights a layer (4 x with betas) and two
    # norm kernels each way, which the kit had left out of Qwen3's layer
    window: int = 0  # sliding-window attention: the keys a query of a windowed layer sees, itself
    # included (HF's sliding_window: Mistral-7B v0.1's 4096; Megatron-core's window_size
    # (window - 1, 0), which Transformer Engine hands flash attention); 0: full causal attention
    window_from: int = 0  # the first windowed layer, counting from 0 (Qwen2's max_window_layers:
    # HF slides its layers from there on); every layer from it on has the window
    token_types: int = 0  # rows of a token-type table added to the embedding (BERT's
    # type_vocab_size, 2); 0: none
    pretraining_heads: bool = False  # BERT's heads past the last layer (HF BertForPreTraining,
    # transformers 5.25 models/bert/modeling_bert.py): the pooler (a dense h x h and tanh over the
    # first token), the MLM transform (dense h x h, gelu, LayerNorm) before the tied decoder, the
    # decoder's vocab-wide bias, and next-sentence prediction's h x 2 dense. The multi-GPU layer
    # had read BERT as GPT-style layers alone: bert-base 108,890,112 parameters, HF's 110,106,428
    name: str = "gpt"
    zoo: str | None = None  # the kit.workload zoo model it came from (its op graph can be captured)

    def __post_init__(self):
        for k in ("layers", "hidden", "heads", "seq", "vocab"):
            v = getattr(self, k)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise KitError(f"model {self.name}: {k} must be a positive whole number, got {v!r}")
        if self.hidden % self.heads:
            raise KitError(f"model {self.name}: hidden {self.hidden} is not a multiple of heads {self.heads}")
        for k, low in (("ffn", 1), ("kv_heads", 1), ("experts", 0), ("moe_every", 1), ("topk", 1)):
            v = getattr(self, k)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < low):
                raise KitError(f"model {self.name}: {k} must be a whole number >= {low}, got {v!r}")
        if self.positions is None:
            object.__setattr__(self, "positions", self.seq)
        if isinstance(self.positions, bool) or not isinstance(self.positions, int) or self.positions < self.seq:
            raise KitError(f"model {self.name}: positions (its learned position table's rows) must be a "
                           f"whole number of at least seq {self.seq}, got {self.positions!r}")
        if self.kv_heads is not None and self.heads % self.kv_heads:
            raise KitError(f"model {self.name}: kv_heads {self.kv_heads} must divide heads {self.heads}")
        if self.experts and self.topk > self.experts:
            raise KitError(f"model {self.name}: topk {self.topk} is more than its {self.experts} experts")
        if self.tied is None:
            object.__setattr__(self, "tied", not self.rope)
        if self.bias is None:
            object.__setattr__(self, "bias", not self.gated)
        for k in ("qkv_bias", "out_bias", "mlp_bias"):
            if getattr(self, k) is None:
                object.__setattr__(self, k, self.bias)
        if self.dropout is None:
            object.__setattr__(self, "dropout", 0.0 if self.gated else 0.1)
        p = self.dropout
        if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0 <= p < 1:
            raise KitError(f"model {self.name}: dropout must be a probability in [0, 1), got {p!r}")
        for k in ("tied", "bias", "qkv_bias", "out_bias", "mlp_bias", "qk_norm", "pretraining_heads"):
            if not isinstance(getattr(self, k), bool):
                raise KitError(f"model {self.name}: {k} must be True or False, got {getattr(self, k)!r}")
        if self.experts and not any(self.is_moe(i) for i in range(self.layers)):
            # experts and --ep had been accepted and changed nothing
            raise KitError(f"model {self.name}: experts={self.experts} with moe_every={self.moe_every} "
                           f"makes none of its {self.layers} layers MoE (layers moe_every, 2 x moe_every, "
                           "... counting from 1, are); lower moe_every or add layers")
        cf = self.capacity_factor
        if cf is not None:
            if isinstance(cf, bool) or not isinstance(cf, (int, float)) or not 0 < cf < float("inf"):
                raise KitError(f"model {self.name}: capacity_factor must be a positive finite number, "
                               f"got {cf!r}")
            if not self.experts:  # it would be accepted and change nothing
                raise KitError(f"model {self.name}: capacity_factor applies to experts; give "
                               "experts=N (a moe: shape) or drop capacity_factor")
        for k in ("window", "window_from", "token_types"):
            v = getattr(self, k)
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise KitError(f"model {self.name}: {k} must be a whole number >= 0, got {v!r}")
        if self.window_from and not self.window:  # it would be accepted and change nothing
            raise KitError(f"model {self.name}: window_from applies to a sliding window; give "
                           "window=N (the keys a query sees) or drop window_from")
        if self.window and self.pretraining_heads:  # the band is a causal one (ops.Attention)
            raise KitError(f"model {self.name}: a sliding window applies to causal attention; "
                           "BERT's (pretraining_heads) attends both ways: drop window or pretraining_heads")
        if self.window_from >= self.layers:
            raise KitError(f"model {self.name}: window_from {self.window_from} leaves none of its "
                           f"{self.layers} layers (0 .. {self.layers - 1}) windowed")
        if self.attention not in ("flash", "unfused"):
            raise KitError(f"model {self.name}: attention must be flash or unfused, got {self.attention!r}")

    @property
    def f(self) -> int:
        return self.ffn or 4 * self.hidden

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def mlp_matrices(self) -> int:
        """Weight matrices in one MLP (or one expert): 3 for SwiGLU, else 2."""
        return 3 if self.gated else 2

    @property
    def norm_params(self) -> int:
        """One norm's parameters: LayerNorm's weight and bias (2h), RMSNorm's weight (h)."""
        return (2 if self.bias else 1) * self.hidden

    @property
    def mlp_out_bias(self) -> int:
        """The bias of an MLP's (or expert's) down projection, added after the row-parallel
        reduction: h, or 0 without MLP biases."""
        return self.hidden if self.mlp_bias else 0

    @property
    def mlp_params(self) -> int:
        """One MLP's (or one expert's) weights and biases: the column-parallel projections'
        (f each) and the down projection's (h)."""
        biases = (self.mlp_matrices - 1) * self.f + self.hidden if self.mlp_bias else 0
        return self.mlp_matrices * self.hidden * self.f + biases

    def routed_rows(self, tokens: int) -> int:
        """Rows a MoE layer's experts take (and its all-to-alls move) for `tokens` tokens on a
        rank: tokens x topk when dropless; with a capacity factor every expert's buffer of
        ceil(capacity_factor x tokens x topk / experts) rows (Megatron-core's get_capacity;
        Switch's capacity = capacity_factor x tokens / experts at top-1), padded as GShard,
        Switch and DeepSpeed-MoE dispatch them, the overflow dropped."""
        rows = tokens * self.topk
        if self.capacity_factor is None:
            return rows
        per_expert = self.capacity_factor * rows / self.experts
        if not per_expert < 2**63:  # 1e306 x 512 rows is float inf: math.ceil had raised OverflowError
            raise KitError(f"model {self.name}: capacity_factor {self.capacity_factor} gives each expert "
                           f"{per_expert:.3g} rows ({tokens} tokens x top-{self.topk} / {self.experts} "
                           "experts x the factor), more than any tensor holds (2**63 - 1)")
        return self.experts * math.ceil(per_expert)

    @property
    def causal(self) -> bool:
        """Whether a layer's attention is causal: GPT-style decoders'; BERT's (the config reader's
        bert family, marked by its pretraining heads) attends both ways, megatron-core 0.16.1's
        BERT layers building their attention with AttnMaskType.padding
        (models/bert/bert_layer_specs.py 64, 103; bert_model.py 201-213), no causal mask."""
        return not self.pretraining_heads

    def window_of(self, layer: int) -> int:
        """The sliding window of a layer's attention (GPTSpec.window from window_from on), or 0
        for full causal attention."""
        return self.window if self.window and layer >= self.window_from else 0

    @property
    def qk_norm_params(self) -> int:
        """q_norm's and k_norm's parameters in a layer: a head wide each, weights (and with
        biases LayerNorm's betas too, as Megatron-core's --qk-layernorm follows --normalization)."""
        return 2 * (2 if self.bias else 1) * self.head_dim if self.qk_norm else 0

    def is_moe(self, layer: int) -> bool:
        return self.experts > 0 and (layer % self.moe_every) == self.moe_every - 1

    def layer_params(self, layer: int = 0) -> int:
        h, kv = self.hidden, (self.kv_heads or self.heads) * self.head_dim
        # QKV [h, h + 2kv] and its bias h + 2kv (grouped-query attention: 4h had been counted
        # whatever kv_heads was), the output projection [h, h] and its bias
        attn = h * (h + 2 * kv) + h * h + (h + 2 * kv if self.qkv_bias else 0) + (h if self.out_bias else 0)
        mlp = self.mlp_params
        if self.is_moe(layer):
            mlp = self.experts * mlp + h * self.experts  # and the router's weight
        return attn + self.qk_norm_params + mlp + 2 * self.norm_params

    @property
    def pretraining_dense_params(self) -> int:
        """BERT's pretraining heads' dense layers and their norm (GPTSpec.pretraining_heads): the
        pooler's h x h + h, the MLM transform's h x h + h and its LayerNorm, next-sentence
        prediction's h x 2 + 2 (Megatron-core builds each whole on every TP rank); 0 without."""
        h = self.hidden
        return 2 * (h * h + h) + self.norm_params + 2 * h + 2 if self.pretraining_heads else 0

    @property
    def params(self) -> int:
        embed = (1 if self.tied else 2) * self.vocab * self.hidden + self.token_types * self.hidden
        positions = 0 if self.rope else self.positions * self.hidden
        heads = self.pretraining_dense_params + (self.vocab if self.pretraining_heads else 0)
        return (sum(self.layer_params(i) for i in range(self.layers)) + embed + positions
                + self.norm_params + heads)

    @property
    def active_params(self) -> int:
        """Parameters one token passes through: a MoE layer's top-k experts, not all of them."""
        idle = self.mlp_params
        moe_layers = sum(self.is_moe(i) for i in range(self.layers))
        return self.params - moe_layers * (self.experts - self.topk) * idle

    def to_dict(self) -> dict:
        return {"name": self.name, "layers": self.layers, "hidden": self.hidden, "heads": self.heads,
                "seq": self.seq, "vocab": self.vocab, "ffn": self.f, "kv_heads": self.kv_heads,
                "experts": self.experts, "capacity_factor": self.capacity_factor, "gated": self.gated, "rope": self.rope, "tied": self.tied,
                "positions": None if self.rope else self.positions, "attention": self.attention,
                "bias": self.bias, "qkv_bias": self.qkv_bias, "out_bias": self.out_bias,
                "mlp_bias": self.mlp_bias, "qk_norm": self.qk_norm, "dropout": self.dropout, "params": self.params,
                # only where there is one: a full-attention spec's dict stays as it was
                **({"window": self.window, "window_from": self.window_from} if self.window else {}),
                **({"token_types": self.token_types} if self.token_types else {}),
                **({"pretraining_heads": True} if self.pretraining_heads else {})}


def _flag(v: str) -> bool:
    return {"1": True, "true": True, "0": False, "false": False}[v.lower()]


_INLINE = re.compile(r"^(gpt|moe|llama):(.*)$", re.I)
_KEYS = {"layers": int, "hidden": int, "heads": int, "seq": int, "vocab": int, "ffn": int,
         "kv_heads": int, "experts": int, "moe_every": int, "topk": int, "capacity_factor": float, "attention": str, "positions": int, "dropout": float,
         "gated": _flag, "rope": _flag, "tied": _flag, "bias": _flag, "qkv_bias": _flag, "out_bias": _flag, "mlp_bias": _flag,
         "qk_norm": _flag, "window": int, "window_from": int,
         "token_types": int, "pretraining_heads": _flag}


def parse_model(text: str, seq: int | None = None) -> GPTSpec:
    """An inline shape (`gpt:layers=96,hidden=12288,heads=96,seq=2048,vocab=51200[,ffn=...]`) or
    a GPT-style zoo name (gpt2, gpt3-175b, ...). A `llama:` shape is Llama-style unless told
    otherwise (gated=true: a SwiGLU MLP; rope=true: rotary positions); `moe:` needs experts=N."""
    m = _INLINE.match(text.strip())
    if m:
        kw: dict = {}
        for part in filter(None, m.group(2).split(",")):
            if "=" not in part:
                raise KitError(f"model {text!r}: expected key=value, got {part!r}")
            k, v = (s.strip() for s in part.split("=", 1))
            k = k.replace("-", "_")
            if k not in _KEYS:
                raise KitError(f"model {text!r}: unknown key {k!r}; valid: {', '.join(_KEYS)}")
            if k in kw:  # the last one had won without a word
                raise KitError(f"model {text!r}: {k} is given twice")
            try:
                kw[k] = _KEYS[k](v)
            except (ValueError, KeyError):
                kind = "true or false" if _KEYS[k] is _flag else _KEYS[k].__name__
                raise KitError(f"model {text!r}: {k} must be {kind}, got {v!r}") from None
        missing = [k for k in ("layers", "hidden", "heads") if k not in kw]
        if missing:
            raise KitError(f"model {text!r}: missing {', '.join(missing)}")
        if m.group(1).lower() == "moe" and not kw.get("experts"):
            raise KitError(f"model {text!r}: a moe: shape needs experts=N (N >= 1)")
        moe_only = [k for k in ("topk", "moe_every", "capacity_factor") if k in kw]
        if moe_only and not kw.get("experts"):  # it had been accepted and ignored
            raise KitError(f"model {text!r}: {moe_only[0]} applies to experts; give experts=N (a moe: "
                           f"shape) or drop {moe_only[0]}")
        if m.group(1).lower() == "llama":
            kw.setdefault("gated", True)
            kw.setdefault("rope", True)
        if seq is not None:
            if kw.get("seq", seq) != seq:  # one of the two had silently won
                raise KitError(f"model {text!r} gives seq={kw['seq']} and the sequence length asked "
                               f"for is {seq}: give it once (in the shape or as --seq / seq=)")
            kw["seq"] = seq
        return GPTSpec(name=text, **kw)
    return _from_zoo(text, seq)


def _dropout_of(name: str, c: dict) -> float | None:
    # GPT-2's resid_pdrop, OPT's dropout, BERT's hidden_dropout_prob (GPT-NeoX's, BLOOM's
    # and Falcon's hidden_dropout had been read here: _refuse_misread refuses those families)
    for key in ("resid_pdrop", "dropout", "hidden_dropout_prob"):
        if key in c:
            p = c[key]
            if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0 <= p < 1:
                raise KitError(f"model config {name}: {key} must be a probability in [0, 1), got {p!r}")
            return float(p)
    return None


# the model_types whose layer the multi-GPU path reads into a GPTSpec (GPT-2, OPT and the Llama
# families as the zoo's modules build them; BERT as GPT-style layers of its widths)
READ_FAMILIES = ("gpt2", "opt", "bert", "llama", "mistral", "mixtral", "qwen2", "qwen3", "gemma", "phi3")
# refused with a reason of their own further on (one GPU models them)
OWN_REFUSALS = ("deepseek_v3", "gpt_oss", "qwen2_moe", "qwen3_moe")
# rows an OPT position table has past max_position_embeddings (HF transformers 5.25
# models/opt/modeling_opt.py OPTLearnedPositionalEmbedding: offset 2, as zoo_models' OPT builds it)
OPT_OFFSET = 2
# Falcon's config keys that change its layer (HF FalconConfig, transformers 5.25
# models/falcon/configuration_falcon.py; the RefinedWeb model_types are its first releases')
FALCON_KEYS = ("parallel_attn", "multi_query", "new_decoder_architecture", "num_kv_heads", "n_head_kv",
               "num_ln_in_parallel_attn", "alibi", "bias", "ffn_hidden_size")


def _refuse_misread(name: str, c: dict) -> None:
    """A KitError for a config whose layer GPTSpec would misread. Any model_type with a width,
    layers and heads had been read as a GPT-2 layer: a Falcon-7B config.json as 8,228,502,400
    parameters (71 KV heads, a learned position table, biases, attention then MLP) where HF's
    FalconForCausalLM has 6,921,720,704 (one KV head, rotary positions, no linear biases,
    attention beside the MLP); Gemma 2's and 3's four norms a layer as two."""
    family = c.get("model_type")
    if family is None and "n_embd" in c:  # GPT-2's keys, as one GPU's zoo.build reads them; an
        family = "gpt2"  # empty model_type is refused there, and had been read as GPT-2 here
    if family in READ_FAMILIES or family in OWN_REFUSALS:
        return
    if family in ("falcon", "RefinedWeb", "RefinedWebModel"):
        keys = [k for k in FALCON_KEYS if k in c]
        raise KitError(f"model {name!r} (model_type {family!r}): the kit does not model Falcon's "
                       "layer: attention beside the MLP (parallel_attn), multi-query or grouped KV "
                       "heads (multi_query, num_kv_heads / n_head_kv), two norms a layer "
                       "(new_decoder_architecture), rotary or ALiBi positions (alibi), no linear "
                       f"biases (bias){'; its config sets ' + ', '.join(keys) if keys else ''}; nor does "
                       "one GPU's zoo build it")
    if family == "vit":  # no vocabulary nor token sequence: GPT-2's 50,257 words and seq 1 were taken
        raise KitError(f"model {name!r} (model_type 'vit'): the multi-GPU layer models a token "
                       "sequence with a vocabulary's embedding and LM head, not a ViT's patch "
                       "embedding, its (image_size / patch_size)^2 + 1 tokens and its classifier "
                       "(it had been read as one token a sample under GPT-2's 50,257-word head); "
                       "predict it on one GPU (--gpu)")
    if family in ("gemma2", "gemma3_text"):
        raise KitError(f"model {name!r} (model_type {family!r}): the multi-GPU layer does not model "
                       "its four norms a layer (after attention and around the MLP), soft-capped or "
                       "sliding-window attention; predict it on one GPU (--gpu)")
    from kit.workload.zoo import FAMILIES

    if family is None:  # nothing says whether it is a GPT-2, OPT or Llama layer: ask for it
        raise KitError(f"model {name!r}: a config without model_type (nor GPT-2's n_embd) could be "
                       "any family's layer; add its model_type, one of the multi-GPU layer's "
                       f"({', '.join(READ_FAMILIES)}), as its HF config.json has it")
    where = ("predict it on one GPU (--gpu)" if family in FAMILIES else
             f"the kit builds none of its kind (one GPU takes {', '.join(FAMILIES)})")
    raise KitError(f"model {name!r}: model_type {family!r} is not one the multi-GPU layer reads "
                   f"({', '.join(READ_FAMILIES)}); reading it as a GPT-2 layer would misstate its "
                   f"heads, widths and parameters: {where}")


def _window_of(name: str, c: dict) -> tuple[int, int]:
    """(window, window_from) of a Llama-family config, its layers windowed as HF's are
    (kit.workload.modes.sliding_windows: Mistral's sliding_window on every layer, Qwen2's and
    Qwen3's under use_sliding_window from max_window_layers on, Phi-3's on every layer): the
    multi-GPU layer had read none and run full causal attention past the window. (0, 0): none."""
    from kit.workload.modes import sliding_windows

    try:  # it refuses a window, max_window_layers or layer_types it cannot read
        per_layer = sliding_windows(c)
    except KitError as e:
        raise KitError(f"model {name!r}: {e}") from None
    slid = [i for i, w in enumerate(per_layer) if w]
    if not slid:
        return 0, 0
    sizes, first = {per_layer[i] for i in slid}, slid[0]
    if len(sizes) > 1 or slid != list(range(first, len(per_layer))):
        raise KitError(f"model {name!r}: its sliding-window layers ({', '.join(map(str, slid))} of "
                       f"{len(per_layer)}) are not every layer from one on; the multi-GPU layer "
                       "models a window on the layers from window_from on: predict it on one GPU (--gpu)")
    return per_layer[first], first


def _from_zoo(name: str, seq: int | None) -> GPTSpec:
    try:
        from kit.workload.zoo import check_seq, config, default_seq, max_seq, resolve
    except ImportError:  # pragma: no cover - the zoo ships with the kit
        raise KitError(f"unknown model {name!r}; give an inline shape gpt:layers=..,hidden=..,heads=..")
    if ":" in name:  # a Python path: kit.workload.models loads those, on one GPU only
        raise KitError(f"model {name!r}: a Python path 'module:callable' is predicted on one GPU "
                       "(--gpu); multi-GPU prediction takes a GPT-style zoo name or an inline "
                       "gpt:layers=..,hidden=..,heads=.. shape")
    if name.lower().endswith(".json"):  # an HF-style config file: the analytic layer (no zoo graph)
        from kit.workload.models import read_config

        c, key = read_config(name), None
        kind = c.get("model_type")
        if kind is not None and not isinstance(kind, str):  # a list had raised "unhashable type"
            raise KitError(f"model config {name}: model_type must be a string such as 'llama', got {kind!r}")
        _refuse_misread(name, c)  # before asking for keys (vocab_size) a refused family lacks
        if not c.get("vocab_size"):  # a zoo config always has one; a file's would be guessed
            raise KitError(f"model config {name} has no vocab_size: the multi-GPU layer needs the "
                           "vocabulary for the embedding and LM head; add it")
        for field in ("n_positions", "max_position_embeddings"):  # the learned position tables
            v = c.get(field)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
                raise KitError(f"model config {name}: {field} must be a positive whole number (the "
                               f"positions the model learned), got {v!r}")
        if seq is not None:
            check_seq(c, seq)
        seq = seq or min(512, max_seq(c) or 512)  # as one GPU's default for a config (zoo.graph_for)
    else:
        key = resolve(name)
        c = config(key)
        if seq is not None:  # the analytic layer too: a zoo model's learned position table is its limit
            check_seq(key, seq)
    h = c.get("n_embd") or c.get("hidden_size")
    layers = c.get("n_layer") or c.get("num_hidden_layers")
    heads = c.get("n_head") or c.get("num_attention_heads")
    if not (h and layers and heads):
        raise KitError(f"model {name!r} is not a transformer layer stack; multi-GPU prediction "
                       "takes zoo models whose config gives a width, layers and heads (n_embd or "
                       "hidden_size, n_layer or num_hidden_layers, n_head or num_attention_heads: "
                       "GPT-2/3, OPT, BERT, Llama, Mistral, Mixtral, Qwen2/3, Gemma, Phi-3), each "
                       "modelled as GPT-style layers, and inline gpt:/llama:/moe: shapes; predict "
                       "it on one GPU (--gpu)")
    _refuse_misread(name, c)
    if c.get("model_type") == "deepseek_v3":
        raise KitError(f"model {name!r}: the multi-GPU layer does not model DeepSeek's latent "
                       "attention and MoE layers; predict it on one GPU (--gpu)")
    if c.get("model_type") == "gpt_oss":
        raise KitError(f"model {name!r}: the multi-GPU layer does not model GPT-OSS's attention "
                       "sinks and biased, clamped experts; predict it on one GPU (--gpu)")
    if c.get("model_type") in ("qwen2_moe", "qwen3_moe"):  # num_experts, moe_intermediate_size
        raise KitError(f"model {name!r}: the multi-GPU layer does not model Qwen's MoE layers; "
                       "predict it on one GPU (--gpu)")
    proj = c.get("word_embed_proj_dim")
    if proj is not None and proj != h:  # OPT-350m's: 512-wide embeddings projected to 1024
        raise KitError(f"model {name!r} embeds tokens {proj} wide and projects them to its "
                       f"{h}-wide layers (word_embed_proj_dim); the multi-GPU layer does not model "
                       "those projections: predict it on one GPU (--gpu)")
    if c.get("model_type") == "opt":
        off = [k for k in ("do_layer_norm_before", "layer_norm_elementwise_affine") if c.get(k) is False]
        if off:  # post-norm layers without a final norm; norms without weights (zoo_models' OPT)
            raise KitError(f"model {name!r} (opt) sets {' and '.join(off)} false: the multi-GPU "
                           "layer models pre-norm layers with LayerNorm weights; predict it on one "
                           "GPU (--gpu)")
    from kit.workload.modes import LLAMA_FAMILIES, TIED_BY_DEFAULT  # (zoo_modern imports torch)
    from kit.workload.zoo_configs import hf_value

    llama = c.get("model_type") in LLAMA_FAMILIES
    # keys a Llama-family config leaves out read as HF builds it (zoo_configs.HF_DEFAULTS), as the
    # zoo's one-GPU module reads them: a Mixtral config without num_local_experts had been a dense
    # 8.0B model, HF's 8 experts top-2 (46.7B); a Mistral one without num_key_value_heads 32 KV
    # heads, HF's 8; a Gemma one without head_dim 16 heads of 192, HF's of 256
    read = hf_value if llama else (lambda cfg, key: cfg.get(key))

    def moe(key):  # a MoE key left out or null: HF's default, as the zoo's _moe_key reads it
        if c.get(key) is None:
            return read({"model_type": c.get("model_type")}, key)
        if isinstance(c[key], bool) or not isinstance(c[key], int) or c[key] < 1:
            # a Mixtral config's num_local_experts 0 had been read as HF's 8 (before, as dense);
            # the one-GPU zoo refuses it (zoo_checks.SIZE_FIELDS)
            raise KitError(f"model {name!r}: {key} must be a positive whole number, got {c[key]!r}")
        return c[key]

    experts = moe("num_local_experts") or 0  # Mixtral-style: every layer's MLP is MoE
    if llama and not (c.get("intermediate_size") or c.get("n_inner") or c.get("ffn_dim")):
        # HF's classes default it to their own models' widths (Llama 11008, Mistral 14336), not 4 x
        # hidden, which had been used; the one-GPU zoo refuses such a config too (missing key)
        raise KitError(f"model {name!r} ({c.get('model_type')}) has no intermediate_size: give the "
                       "MLP's width")
    head_dim = read(c, "head_dim")
    if head_dim is not None and head_dim * heads != h:
        raise KitError(f"model {name!r} has {heads} heads of {head_dim} over a {h}-wide model; the "
                       "multi-GPU layer assumes heads x head size = hidden: predict it on one GPU "
                       "(--gpu)")
    # the zoo's Llama-style modules (kit.workload.zoo_modern): RMSNorm and the linear biases HF
    # builds (modes.linear_biases: Qwen2's on q, k and v; attention_bias's on q, k, v and o where
    # HF reads it; Llama's mlp_bias on gate, up and down); GPT-2's and BERT's biased linears and
    # LayerNorms, OPT's linears as its enable_bias says
    family = c.get("model_type")
    if llama:
        from kit.workload.modes import linear_biases

        qkv_bias, out_bias, mlp_bias = linear_biases(c)
    else:
        qkv_bias = out_bias = mlp_bias = family != "opt" or bool(c.get("enable_bias", True))
    window, window_from = _window_of(name, c) if llama else (0, 0)
    rows = max_seq(c)  # the learned position table's (None: as many as seq); OPT's 2 more
    rows = rows + OPT_OFFSET if rows and family == "opt" else rows
    bert = family == "bert"  # its token-type table (HF's default type_vocab_size 2) and heads
    types = c.get("type_vocab_size", 2) if bert else 0
    if isinstance(types, bool) or not isinstance(types, int) or types < 1 and bert:
        raise KitError(f"model {name!r}: type_vocab_size must be a positive whole number, got {types!r}")
    return GPTSpec(layers=layers, hidden=h, heads=heads, seq=seq or default_seq(key),
                   token_types=types, pretraining_heads=bert,
                   vocab=c.get("vocab_size", 50257), ffn=c.get("n_inner") or c.get("intermediate_size")
                   or c.get("ffn_dim"), kv_heads=read(c, "num_key_value_heads"), experts=experts,
                   moe_every=1, topk=moe("num_experts_per_tok") or 2, name=key or c["name"], zoo=key,
                   gated=llama, rope=llama, positions=None if llama else rows,
                   bias=not llama, qkv_bias=qkv_bias, out_bias=out_bias, mlp_bias=mlp_bias,
                   # as the zoo's module norms each head of q and k (zoo_modern's Attention)
                   qk_norm=family in ("qwen3", "gemma3_text"), window=window, window_from=window_from,
                   # HF's Llama-style layers have no hidden dropout (and attention_dropout 0);
                   # GPT-2's resid_pdrop, OPT's dropout, BERT's hidden_dropout_prob
                   dropout=0.0 if llama else _dropout_of(name, c),
                   # as the zoo's modules tie them: HF's defaults (GPT-2, OPT tie; of the Llama
                   # families, TIED_BY_DEFAULT's), unless the config says
                   tied=bool(c.get("tie_word_embeddings", c.get("model_type") in TIED_BY_DEFAULT if llama else True)))
