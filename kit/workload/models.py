"""What a user may hand the kit as a model, turned into a captured graph.

    "gpt2-large"              a zoo name (kit.workload.zoo; cached per shape)
    {"model_type": "gpt2", ...}  an HF-style config dict (cached per shape)
    "config.json"             an HF-style config file (as the dict above)
    "mypkg.models:make"       a Python path "module:callable"; the callable returns an
                              nn.Module (with example_inputs(batch, seq), or taking
                              input_ids of shape (batch, seq)), a config dict, or a
                              (module, inputs) pair
    an nn.Module              the same, passed directly
"""
from __future__ import annotations

import importlib
import inspect
import json
import numbers
import os
import sys
import warnings
from pathlib import Path

from kit.errors import KitError, one_line, refuse_device, yes_no

OPTIMIZER_STATE_TENSORS = {"adamw": 2, "adamw-fused": 2, "adam": 2, "sgd": 1, None: 0, "none": 0}
# the dtypes a whole model is captured in (kit.workload.capture.DTYPE_CHOICES, without torch):
# model keeps each parameter in the dtype the module holds
DTYPES = ("fp32", "tf32", "fp16", "bf16", "model")


def load_callable(spec: str):
    mod_name, _, attr = spec.partition(":")
    if "=" in attr:  # an inline shape (gpt:layers=..,hidden=..): kit.parallel reads those
        raise KitError(f"model {spec!r}: inline shapes (gpt:/moe:/llama:key=value,...) are for "
                       "multi-GPU prediction (--system); on one GPU give a zoo name, an HF-style "
                       "config .json file or a Python path 'module:callable'")
    if not mod_name or not attr:
        raise KitError(f"model path {spec!r} must look like 'module:callable'")
    if str(Path.cwd()) not in sys.path:
        sys.path.insert(0, str(Path.cwd()))
    try:
        module = importlib.import_module(mod_name)
    except ImportError as e:
        raise KitError(f"cannot import module {mod_name!r} for model {spec!r}: {e}") from None
    except SystemExit as e:  # sys.exit(0) would end the run silently with success
        raise KitError(f"importing module {mod_name!r} for model {spec!r} {_exited(e)}") from None
    except Exception as e:  # the user's module failed while importing (SyntaxError, NameError, ...)
        raise KitError(f"importing module {mod_name!r} for model {spec!r} failed: {one_line(e)}") from None
    obj = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise KitError(f"module {mod_name!r} has no attribute {attr!r}")
        obj = getattr(obj, part)
    return obj


def built_model(model):
    """What a 'module:callable' path (or a callable, or an nn.Module) gives: the callable is
    called with no arguments (an nn.Module, a config dict or (module, inputs)); any failure is
    one KitError naming it."""
    import torch

    obj = load_callable(model) if isinstance(model, str) else model
    name = model if isinstance(model, str) else type(model).__name__
    if callable(obj) and not isinstance(obj, torch.nn.Module):
        try:
            inspect.signature(obj).bind()
        except TypeError as e:
            raise KitError(f"model callable {name!r} must take no arguments: {e}") from None
        except ValueError:  # a builtin without a signature: let the call say
            pass
        try:
            obj = obj()
        except SystemExit as e:
            raise KitError(f"model callable {name!r} {_exited(e)}") from None
        except Exception as e:
            raise KitError(f"model callable {name!r} failed: {one_line(e)}") from None
    return obj


def _exited(e: SystemExit) -> str:
    """A user's code calling sys.exit() (or raising SystemExit), as the rest of a KitError."""
    return (f"called sys.exit({e.code!r}); a model's code must return, not exit the program")


def read_config(path: str) -> dict:
    """An HF-style config.json file as a dict (its file name, without .json, names the model)."""
    p = Path(path)
    refuse_device(p, "model config")  # a .json link to /dev/zero was read to a MemoryError
    try:
        cfg = json.loads(p.read_text())
    except FileNotFoundError:
        raise KitError(f"model config file not found: {path}") from None
    except (OSError, UnicodeDecodeError) as e:
        raise KitError(f"cannot read model config {path}: {one_line(e)}") from None
    except json.JSONDecodeError as e:
        raise KitError(f"model config {path} is not valid JSON: {e.msg} at line {e.lineno}") from None
    if not isinstance(cfg, dict):
        raise KitError(f"model config {path} must be a JSON object (an HF config.json), "
                       f"got a {type(cfg).__name__}")
    return {"name": p.stem, **cfg}


def _inputs_for(module, batch: int, seq: int):
    if hasattr(module, "example_inputs"):
        try:
            inputs = module.example_inputs(batch, seq)
        except SystemExit as e:
            raise KitError(f"{type(module).__name__}.example_inputs({batch}, {seq}) {_exited(e)}") from None
        except Exception as e:
            raise KitError(f"{type(module).__name__}.example_inputs({batch}, {seq}) failed: "
                           f"{one_line(e)}") from None
        if inputs is None:  # had reached the forward as its one input: "linear(): argument
            # 'input' must be Tensor, not NoneType", as if the model were at fault
            raise KitError(f"{type(module).__name__}.example_inputs({batch}, {seq}) returned None: "
                           "return the forward's inputs, a tuple of tensors (positional) or a "
                           "dict (keyword)")
        return inputs
    import torch

    return (torch.zeros(batch, seq, dtype=torch.long, device="meta"),)


def graph_of(model, batch: int | None, seq: int | None = None, mode: str = "train", dtype: str = "fp32",
             optimizer: str | None = None, inputs=None, kv_cache: str = "static", loss: bool = True,
             last_logits: bool = False, cache_len: int | None = None):
    """The captured OpGraph of any supported model spec at one shape. batch None: not given (1,
    or the batch of a module's own example inputs). `inputs` (a tuple or a dict of tensors, any
    device) overrides the example inputs of a module. kv_cache: a decode step's
    cache, "static" or "dynamic" (kit.workload.kv_cache; the zoo's decoders). loss: a zoo or
    HF-style language model's training step includes the cross-entropy over the vocabulary
    (kit.workload.zoo.lm_loss); False backpropagates from the logits. A module of your own is
    captured as its forward returns: return the loss to include it. last_logits: a zoo or HF-style
    decoder's inference pass computes the last position's logits only (generation's prefill).
    cache_len: a zoo decoder's static cache preallocated for that many tokens (zoo.graph_for).
    dtype: fp32, tf32, fp16 or bf16 casts every parameter and floating input to it; "model" keeps
    each parameter and buffer in the dtype the module holds, its floating inputs in its main dtype
    (kit.workload.capture.main_dtype); the graph's meta "dtype" is then that main dtype and
    "model_dtypes" the parameters in each. The zoo's models and HF-style configs are built in
    fp32: "model" prices them as fp32."""
    if isinstance(model, os.PathLike):  # a config file given as a Path, as a str is taken
        model = os.fspath(model)
    batch, seq = (int(v) if isinstance(v, numbers.Integral) and not isinstance(v, bool) else v
                  for v in (batch, seq))  # numpy integers, as kit.api.predict_generation takes them
    if not isinstance(dtype, str):  # None had been priced as fp32 without a word
        raise KitError(f"unknown dtype {dtype!r}: give a name such as 'fp32' or 'bf16'")
    if dtype not in DTYPES:
        raise KitError(f"unknown dtype {dtype!r}: choose one of {', '.join(DTYPES)} (model: each "
                       "parameter in the dtype the module holds)")
    zoo_args = (kv_cache, yes_no(loss, "loss"), yes_no(last_logits, "last_logits"), cache_len)
    batch_given = batch is not None  # a module's own inputs fix the batch: one asked for is refused
    batch = 1 if batch is None else batch
    if isinstance(model, dict):
        _refuse_inputs_of_config(inputs, "a config dict")
        return _zoo_graph(model, batch, seq, mode, dtype, optimizer, *zoo_args)
    if isinstance(model, str) and model.lower().endswith(".json"):
        _refuse_inputs_of_config(inputs, f"config file {model!r}")
        return _zoo_graph(read_config(model), batch, seq, mode, dtype, optimizer, *zoo_args)
    if isinstance(model, str) and ":" not in model:
        _refuse_inputs_of_config(inputs, f"zoo model {model!r}")
        return _zoo_graph(model, batch, seq, mode, dtype, optimizer, *zoo_args)
    obj = built_model(model)
    name = model if isinstance(model, str) else type(model).__name__
    import torch

    if isinstance(obj, dict):  # named after the callable that made it, unless it names itself
        _refuse_inputs_of_config(inputs, f"model {name!r} (it gave a config dict)")
        return _zoo_graph({"name": name, **obj}, batch, seq, mode, dtype, optimizer, *zoo_args)
    if isinstance(obj, tuple) and len(obj) == 2 and isinstance(obj[0], torch.nn.Module):
        if inputs is not None:  # they had been dropped for the callable's own, without a word
            raise KitError(f"model {name!r} gave (module, inputs): its own example inputs; give no "
                           "inputs= as well, or have it return the module alone")
        obj, inputs = obj
    if not isinstance(obj, torch.nn.Module):
        raise KitError(f"model {name!r} gave a {type(obj).__name__}; expected an nn.Module, a "
                       "config dict or (module, inputs)")
    from torch.utils._pytree import tree_leaves

    from kit.workload import zoo
    from kit.workload.capture import TORCH_DTYPES, capture, main_dtype
    from kit.workload.capture_errors import CaptureNotAboutInputs

    zoo._check_positive(batch=batch)
    zoo.check_mode(None, mode, optimizer, kv_cache)
    if kv_cache != "static":
        raise KitError(f"a {kv_cache} KV cache is built for the zoo's decoders and HF-style configs; "
                       f"model {name!r} brings its own cache through decode_inputs")
    decode = mode == "decode"  # the new tokens and a KV cache, from the module's decode_inputs
    guessed = inputs is None and not decode and not hasattr(obj, "example_inputs")
    given = inputs is not None  # the caller's own inputs, not the module's decode_inputs
    if inputs is None:
        seq = 512 if seq is None else seq  # 0 is refused below, never replaced
        zoo._check_positive(seq=seq)
        zoo.check_tokens(batch, seq, decode=decode)
        inputs = _decode_inputs_for(obj, name, batch, seq) if decode else _inputs_for(obj, batch, seq)
        meta = {"batch": batch, "seq": seq}
    else:  # the inputs fix the shape: a batch or seq asked for would be silently ignored
        if batch_given or seq is not None:
            raise KitError(f"model {name!r} comes with its own example inputs, which fix the batch "
                           f"and sequence; give no batch or seq (--batch/--seq; got batch {batch}, seq {seq}) or "
                           "return a module that takes input_ids or has example_inputs(batch, seq)")
        meta = {"batch": _leading_dim(inputs, obj), "seq": None}
        if meta["batch"] == 0:  # no work; a GEMM of m = 0 would be named instead of the batch
            raise KitError(f"model {name!r}: its example inputs have a batch of 0; give inputs "
                           "with a batch of at least 1")
    if decode:  # the floating inputs are the cache: its memory
        size = (main_dtype(obj).itemsize if dtype == "model" else
                TORCH_DTYPES[dtype].itemsize if isinstance(dtype, str) and dtype in TORCH_DTYPES else None)
        leaves = [t for t in tree_leaves(inputs) if isinstance(t, torch.Tensor) and t.is_floating_point()]
        meta.update(mode="decode", context=meta["seq"],
                    kv_cache_bytes=int(sum(t.numel() * (size or t.element_size()) for t in leaves)))
        if given and leaves:  # nothing says which of them is the cache: say what was assumed
            warnings.warn(f"mode decode: the {len(leaves)} floating input(s) of model {name!r} are "
                          f"counted as its KV cache ({meta['kv_cache_bytes'] / 2**30:.3g} GiB); give "
                          "the module decode_inputs(batch, context) to say what the cache is")
    try:
        graph = capture(obj, inputs, mode="inference" if decode else mode, optimizer=optimizer,
                        dtype=dtype, name=name, meta=meta)
    except SystemExit as e:  # from the module's forward
        raise KitError(f"model {name!r} {_exited(e)} while it was run") from None
    except KitError as e:
        if not guessed or isinstance(e, CaptureNotAboutInputs):  # not a question of its inputs
            raise
        # the kit fed token ids of shape (batch, seq): say first that its inputs were a guess,
        # then torch's complaint, then how to give the right ones
        raise KitError(f"could not guess the inputs of model {name!r}: it has no "
                       f"example_inputs(batch, seq), and the token ids of shape ({batch}, {seq}) the "
                       f"kit gave it do not fit its forward ({e}); give the module "
                       "example_inputs(batch, seq), make the callable return (module, inputs), or "
                       "pass inputs= to kit.api.predict_model") from None
    if not graph.kernels():  # a step of 0 ms: its rates and costs would divide by it
        raise KitError(f"model {name!r} launches no GPU kernels in mode {mode} (its forward only "
                       "returns or reshapes its inputs): there is no step to time")
    return graph


def _refuse_inputs_of_config(inputs, what: str) -> None:
    """A KitError for inputs given with a zoo name or an HF-style config: the kit builds its token
    ids from batch and seq, so predict_model("gpt2", inputs=(ids of (8, 128),)) had priced batch 1
    at 1024 tokens with no word (10.906 ms on an h100-sxm with and without the inputs)."""
    if inputs is not None:
        raise KitError(f"inputs= goes with an nn.Module (or a callable returning one); {what} is "
                       "built by the kit, which makes its token ids from batch and seq: give those "
                       "instead (--batch/--seq)")


def refuse_loss_left_out_of_none(graph, model, loss) -> None:
    """KitError for loss=False (--no-loss) where no language-model loss was there to leave out:
    the zoo adds the cross-entropy over the vocabulary to a model with a vocab_size only
    (zoo._capture); resnet50's step had been predicted with its own classifier loss kept, and a
    module of your own as its forward returns, with --no-loss taken without a word."""
    if loss is False and not isinstance((graph.meta.get("config") or {}).get("vocab_size"), int):
        name = model if isinstance(model, str) else graph.meta.get("name", type(model).__name__)
        raise KitError(f"--no-loss (loss=False) leaves out a language model's cross-entropy over its "
                       f"vocabulary, and {name} has no vocabulary (vocab_size): its training step "
                       "is the same without it (a vision model's forward computes its own loss; a "
                       "module of your own is captured as its forward returns)")


def _decode_inputs_for(module, name: str, batch: int, context: int):
    """A user's module's decode_inputs(batch, context): the new tokens and a KV cache, as the
    zoo's decoders give them."""
    if not hasattr(module, "decode_inputs"):
        raise KitError(f"mode decode: model {name!r} has no decode_inputs(batch, context) giving "
                       "the new tokens and a KV cache; give it one, or use a zoo decoder or an "
                       "HF-style config")
    try:
        return module.decode_inputs(batch, context)
    except SystemExit as e:
        raise KitError(f"{type(module).__name__}.decode_inputs({batch}, {context}) {_exited(e)}") from None
    except Exception as e:
        raise KitError(f"{type(module).__name__}.decode_inputs({batch}, {context}) failed: "
                       f"{one_line(e)}") from None


def _leading_dim(inputs, module=None) -> int:
    """The batch of given example inputs: the first dimension of their first tensor (1 if none).
    For a module that says where its batch is (batch_first: nn.MultiheadAttention, nn.LSTM,
    nn.Transformer, ...), the second dimension when batch_first is False, and 1 for an
    unbatched input (fewer than 3 dims)."""
    import torch

    values = (list(inputs.values()) if isinstance(inputs, dict) else
              list(inputs) if isinstance(inputs, (tuple, list)) else [inputs])
    batch_first = getattr(module, "batch_first", None)
    for v in values:
        if isinstance(v, torch.Tensor) and v.dim():
            if isinstance(batch_first, bool):
                return int(v.shape[0 if batch_first else 1]) if v.dim() >= 3 else 1
            return int(v.shape[0])
    return 1


def _zoo_graph(model, batch, seq, mode, dtype, optimizer, kv_cache="static", loss=True,
               last_logits=False, cache_len=None):
    """zoo.graph_for, refusing a sequence length for a model that reads none (DLRM). dtype
    "model": the zoo builds its models in fp32, so they are priced as fp32 (the graph says which
    dtype was asked in meta "model_dtypes")."""
    if dtype == "model":
        from dataclasses import replace

        graph = _zoo_graph(model, batch, seq, mode, "fp32", optimizer, kv_cache, loss, last_logits,
                           cache_len)
        # a new graph: the cached one (zoo's LRU) keeps its meta
        return replace(graph, meta={**graph.meta, "model_dtypes": {"fp32": int(graph.meta.get("params", 0))}})
    from kit.workload import zoo
    from kit.workload.zoo_checks import _check_sizes

    if isinstance(model, dict):  # its model_type and sizes, before anything looks them up
        _check_sizes(model.get("model_type", "gpt2"), model)
    reads = zoo.inputs_instead_of_seq(model)
    if seq is not None and reads is not None:
        name = model if isinstance(model, str) else model.get("name", model.get("model_type"))
        raise KitError(f"{name} reads no sequence ({reads}); give no seq (--seq; got {seq})")
    return zoo.graph_for(model, batch, seq, mode, dtype, optimizer, kv_cache=kv_cache, loss=loss,
                         last_logits=last_logits, cache_len=cache_len)


def memory_bytes(graph) -> dict:
    """Rough device-memory need: weights, gradients, optimizer state, activations, a decode
    step's KV cache and the module's buffers (bytes).

    The step is the one captured: a model in --dtype throughout (a bf16 step holds bf16 weights,
    gradients and optimizer state, as torch's optimizers make their state like the parameters,
    and as the step's optimizer kernels are timed); under --dtype model each parameter, its
    gradient and its state count at the parameter's own dtype (param_bytes and
    trainable_param_bytes are summed per parameter, in the dtypes the capture ran them). Mixed
    precision with fp32 master weights and fp32 state would need 12 more bytes a parameter under
    AdamW than a bf16 step. A training
    step captured without an optimizer counts AdamW's state all the same (optimizer_assumed):
    its update is not timed, but a run keeps the state. Gradients and optimizer state are
    those of the trainable parameters (requires_grad; trainable_param_bytes): a frozen backbone
    has neither."""
    m = graph.meta
    weights = int(m.get("param_bytes", 0))
    trainable = int(m.get("trainable_param_bytes", weights))  # a graph from before: all of them
    train = m.get("mode") == "train"
    grads = trainable if train else 0
    # training without a named optimizer: assume AdamW (two state tensors per parameter), each
    # in the parameters' dtype (torch.optim's zeros_like(param))
    states = OPTIMIZER_STATE_TENSORS.get(m.get("optimizer") or "adamw", 2) if train else 0
    optim = states * trainable
    # the step captured without an optimizer has no update to time, but a run needs the state
    assumed = train and not m.get("optimizer")
    acts = int(m.get("activation_bytes", 0))
    cache = int(m.get("kv_cache_bytes", 0))  # a decode step's KV cache (kit.workload.kv_cache)
    buffers = int(m.get("buffer_bytes", 0))  # the module's buffers (masks, RoPE tables, ...)
    return {"weights_bytes": weights, "grads_bytes": grads, "optimizer_bytes": optim,
            "activations_bytes": acts, "kv_cache_bytes": cache, "buffers_bytes": buffers,
            "total_bytes": weights + grads + optim + acts + cache + buffers,
            **({"optimizer_assumed": "adamw"} if assumed else {})}


def memory_fit(graph, gpu) -> dict:
    """memory_bytes of a graph or predicted step (its meta holds the capture's sizes), with the
    GPU's memory and whether the step fits in it, as `kit predict` and `kit compare` report."""
    from kit.hardware import get_gpu

    mem = memory_bytes(graph)
    gpu = get_gpu(gpu)
    return {**mem, **gpu_memory(gpu, mem)}


def gpu_memory(gpu, mem: dict) -> dict:
    """The GPU's memory beside a need: its advertised size, what a step can use of it (less
    in-band ECC: a T4's 15 of 16 GiB) and whether the need fits in that."""
    return {"gpu_memory_bytes": gpu.memory_bytes, "gpu_usable_memory_bytes": gpu.usable_memory_bytes,
            "fits": mem["total_bytes"] <= gpu.usable_memory_bytes}


def max_batch(mem: dict, batch: int, memory_bytes: int) -> int:
    """The largest batch of a decode step or a generation whose memory_bytes estimate fits in
    `memory_bytes`: the weights and buffers stay, the KV cache and the activations grow with the
    batch (both linear in it), so floor((memory - weights - buffers) / per-sequence bytes); 0
    when those alone do not fit."""
    per_sequence = (mem["kv_cache_bytes"] + mem["activations_bytes"]) / batch
    free = memory_bytes - mem["weights_bytes"] - mem.get("buffers_bytes", 0)  # buffers stay too
    return max(int(free // per_sequence), 0) if per_sequence > 0 else 0
