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
import os
import pickle
from collections import OrderedDict
from pathlib import Path

from kit.errors import KitError, one_line, whole_number
from kit.whole_file import replace_file
from kit.workload.modes import (DECODERS, KV_CACHES, LLAMA_FAMILIES, MODES, check_mode,  # noqa: F401
                                decodes)
from kit.workload.zoo_checks import (HEAD_SPLITS, MAX_TOKENS, SIZE_FIELDS, _check_positive,  # noqa: F401
                                     _check_sizes, check_seq, check_tokens, inputs_instead_of_seq,
                                     max_seq, uses_seq)
from kit.workload.zoo_configs import ZOO, config, default_seq, resolve, zoo_names  # noqa: F401

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


def _key(model, batch, seq, mode, dtype, optimizer) -> str | None:
    """The capture's cache key, or None when this process's code is not the disk's (_code_stamp)."""
    from kit import __version__

    stamp = _code_stamp()
    if stamp is None:
        return None
    ident = resolve(model) if isinstance(model, str) else json.dumps(model, sort_keys=True, default=str)
    raw = json.dumps([ident, batch, seq, mode, dtype, _optimizer_name(optimizer), __version__,
                      stamp], default=str)
    return hashlib.sha256(raw.encode()).hexdigest()[:24]


def _code_stamp() -> str | None:
    """Changes whenever the capture code or the models change (invalidates disk caches): a hash
    of the contents of every module in kit/workload and of the op classes a graph pickles
    (kit/ops.py, kit/op_counts.py), hashed again only when a file's size or mtime changes (a
    hash is 2 ms and a warm decode prediction asks 7 times: 29 -> 44 ms). It had been the
    whole-second mtimes of a named list, so two checkouts written in the same second shared a
    key and served each other's graphs (a review's resnet50 came out at another commit's
    4.170 ms kernels for its own 4.306), and rnn.py, which prices a captured recurrent node, was
    not on the list. The installed torch's version is in it too: its decompositions decide the
    aten ops a capture records. None once the files on disk are no longer the ones this process
    imported (source_digest.process_stamp): nothing is then cached."""
    from kit.source_digest import process_stamp

    here = Path(__file__).parent
    files = [*sorted(here.glob("*.py")), here.parent / "ops.py", here.parent / "op_counts.py"]
    torch_file = _torch_version_file()
    return process_stamp("capture", [(f.name, f) for f in files]
                         + ([("torch/version.py", torch_file)] if torch_file else []))


def _torch_version_file() -> Path | None:
    """The installed torch's version.py (its version, git commit and CUDA), found without
    importing torch (a warm prediction from the disk cache never imports it): torch's
    decompositions decide the aten ops a capture records, so a graph captured under one torch is
    not another's. Its bytes, not importlib.metadata's version: importing importlib.metadata and
    asking it cost a warm process ~30 ms (of a ~100 ms warm prediction); this reads 0.3 ms, and
    reads the same file whether or not this process has imported torch."""
    import importlib.util

    try:
        spec = importlib.util.find_spec("torch")
    except (ImportError, ValueError):  # ValueError: a torch in sys.modules without a __spec__
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations))) / "version.py"


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
              kv_cache: str = "static", loss: bool = True, last_logits: bool = False,
              cache_len: int | None = None):
    """The captured OpGraph of a zoo model / config for one shape, cached. kv_cache: how a
    decode step's cache grows, "static" or "dynamic" (kit.workload.kv_cache); "dynamic" with
    mode inference and last_logits: generate's prefill into an empty dynamic cache, for a
    decoder that prefills with its cache (every zoo decoder: kit.workload.modes.decodes). cache_len:
    a static cache's preallocated length (generation's prompt + new tokens - 1, as HF's generate
    sizes it; None: the context and the step's token), with mode inference generate's prefill
    into it. loss: a training
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
    check_tokens(batch, seq if uses_seq(model) else None, decode=mode == "decode")
    # generate's prefill into an empty dynamic cache, its writes inside each layer: an inference
    # pass with a dynamic cache and the last position's logits, as generate computes them, of a
    # decoder that prefills so (every zoo decoder: kit.workload.modes.decodes); refused otherwise
    dynamic_prefill = (mode == "inference" and kv_cache == "dynamic" and bool(last_logits)
                       and cache_len is None and decodes(model))
    check_mode(model, mode, optimizer, "static" if dynamic_prefill else kv_cache)
    check_seq(model, seq, 1 if mode == "decode" else 0)  # decode: the context and the new token
    captured = f"decode:{kv_cache}" if mode == "decode" else mode
    if dynamic_prefill:
        captured += ":dynamic"
    if cache_len is not None:
        captured += f":{_check_cache_len(model, mode, cache_len, seq)}"
    loss = bool(loss) and mode == "train"
    last_logits = bool(last_logits) and mode == "inference"
    if optimizer is not None and _optimizer_name(optimizer) is None:
        # a lambda, closure or partial: its name does not say what it builds (two lambdas share
        # one), in this process or the next, so the capture is neither cached nor keyed
        return _capture(model, batch, seq, captured, dtype, optimizer, loss, last_logits)
    key = _key(model, batch, seq, captured + (":loss" if loss else "") + (":last" if last_logits else ""),
               dtype, optimizer)
    if key is None:  # the code on disk changed under this process: nothing is cached
        return _capture(model, batch, seq, captured, dtype, optimizer, loss, last_logits)
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


def _check_cache_len(model, mode: str, cache_len, seq: int) -> int:
    """A static cache's preallocated length, for a decode step (every zoo decoder's cache and
    mask follow HF 5.25's StaticCache, kit.workload.hf_masks) or generate's prefill into it
    (every zoo decoder, kit.workload.modes.decodes), which must hold the prompt's seq rows. KitError else: it
    had been dropped outside decode, and a prefill of 8 tokens into a 4-row cache had been
    priced (HF's index_copy_ of 8 rows into 4 fails)."""
    if mode != "decode" and not (mode == "inference" and decodes(model)):
        raise KitError(f"cache_len (a static KV cache's preallocated length) goes with mode "
                       f"decode, not {mode}")
    n = whole_number(cache_len, "cache_len")
    if mode == "inference" and n < seq:
        raise KitError(f"a static KV cache preallocated for {n} tokens cannot take a prompt of "
                       f"{seq}: give cache_len of at least {seq}")
    return n


def _write(path: Path, graph) -> None:
    """Pickle a capture (or any cached result) atomically; an unwritable cache is skipped, never
    an error."""
    try:  # a failed write had left its PATH.PID.tmp in the cache
        replace_file(path, pickle.dumps(graph, protocol=pickle.HIGHEST_PROTOCOL), sync=False)
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

        _, kind, capacity = (mode.split(":") + ["", ""])[:3]
        kind = kind or "static"
        inputs = (full.decode_inputs(batch, seq, kind, int(capacity)) if capacity
                  else full.decode_inputs(batch, seq, kind))
        meta.update(mode="decode", context=seq, kv_cache=kind,
                    kv_cache_bytes=cache_bytes(inputs[1], TORCH_DTYPES.get(dtype)))
        mode = "inference"  # captured as a forward pass without gradients
    elif mode.startswith("inference:"):  # generate's prefill into its cache: a static one
        from kit.workload.kv_cache import prefill_cache  # preallocated, or a dynamic one empty

        size = mode.split(":")[1]
        cache = (full.decode_inputs(batch, 0, "dynamic") if size == "dynamic"
                 else full.decode_inputs(batch, 0, "static", int(size)))[1]
        inputs = (full.example_inputs(batch, seq)[0], prefill_cache(cache))
        meta.update(prefill_cache_len=None if size == "dynamic" else int(size),
                    prefill_kv_cache="dynamic" if size == "dynamic" else "static")
        mode = "inference"
    else:
        inputs = full.example_inputs(batch, seq)
    # a decode step whose layers keep caches of different lengths (sliding windows on some
    # layers only, past the window) has layers that differ: no layer can stand for the others
    caches = {tuple(c.keys.shape) for c in inputs[1]} if meta.get("mode") == "decode" else set()
    # likewise a prefill whose sliding layers get a window mask (seq >= window) and the others not
    masks = ({w if w and seq >= w else 0 for w in full.windows}
             if meta.get("mode") != "decode" and hasattr(full, "windows") else set())
    if "prefill_kv_cache" in meta and hasattr(full, "windows"):  # generate's prefill: a sliding
        masks = set(full.windows)  # layer's cache initialises, writes and masks as no full one
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
