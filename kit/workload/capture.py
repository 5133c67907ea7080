"""Capture any torch model into an op graph, on meta tensors: no memory, no GPU.

    graph = capture(model, inputs, mode="train", optimizer="adamw")

The model runs under a TorchDispatchMode (kit.workload.recorder) that records every aten op with
its shapes and dtypes. Parameters and inputs are replaced by meta tensors of the same shapes,
dtypes and requires_grad, so a 175B-parameter model captures in a laptop's memory and the user's
module is left untouched.

* inference: one forward pass under no_grad, modules in eval mode;
* train: forward (train mode: dropout on) + backward from the model's outputs
  (kit.workload.capture_roots), then optionally one optimizer step of the trainable parameters
  (the steady-state step: the state-allocating first step is run unrecorded).

Dependencies come from tensor identity: each storage remembers the node(s) that last wrote it, and
an op depends on the writers of every storage it reads. (A tensor made outside any recorded op,
such as torch.tensor(3.0), may inherit a stale writer if its storage reuses a freed one's
address: a spurious edge to an earlier node, never a missing one.) Module paths come from module
hooks in the forward pass and, in the backward pass, from the autograd node being run (its
sequence number links it to the forward op that created it).

Attention, dropout and recurrent layers run the fused kernels a GPU would (kit.workload.gpu_kernels).
nn.TransformerEncoder's nested-tensor path (a key-padding mask in inference) is off for the
capture: which tokens it skips depends on the mask's values, so every token is costed.

Memory: activation_bytes counts the tensors autograd saves for the backward, less the parameters
and buffers it saves (a GEMM keeps its weight for dx: the weights are counted once, as weights);
trainable_param_bytes, the parameters that require grad, sizes the gradients and optimizer state.
"""
from __future__ import annotations

import sys
import warnings
from collections import Counter
from contextlib import ExitStack, contextmanager

import torch
from torch.utils._pytree import tree_map

from kit.errors import KitError
from kit.workload import fast_path, hf_compat
from kit.workload.capture_errors import DataDependentCapture, capture_failure  # noqa: F401
from kit.workload.capture_roots import backward_root, backward_roots, output_tensors, seeds
from kit.workload.gpu_kernels import GpuKernels
from kit.workload.graph import Node, OpGraph
from kit.workload.kv_cache import kept_tensors
from kit.workload.mapping import nbytes
from kit.workload.recorder import Recorder, layer_of, storage_key  # noqa: F401

_Recorder = Recorder  # the name kit's tests import

MODES = ("train", "inference")
TORCH_DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16,
                "tf32": torch.float32}
# dtype "model": each parameter and buffer keeps the dtype the module holds (a bf16 body with an
# fp32 router, an fp32 embedding feeding bf16 layers), floating inputs take its main dtype
MODEL = "model"
DTYPE_CHOICES = (*TORCH_DTYPES, MODEL)
_DTYPE_NAMES = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16",
                torch.float64: "fp64"}


def check_dtype(dtype) -> None:
    """One KitError for a dtype that is not a name capture takes (None passes: the model's own)."""
    if dtype is not None and (not isinstance(dtype, str) or dtype not in DTYPE_CHOICES):
        raise KitError(f"unknown dtype {dtype!r}: choose one of {', '.join(DTYPE_CHOICES)} (model: "
                       "each parameter in the dtype the module holds)")


def _dtype_sizes(tensors) -> dict:
    """{torch dtype: elements} over the floating tensors (each once: a tied parameter is one)."""
    sizes: dict = {}
    for t in {id(t): t for t in tensors}.values():
        if t.is_floating_point():
            sizes[t.dtype] = sizes.get(t.dtype, 0) + int(t.numel())
    return sizes


def param_dtypes(model) -> dict:
    """{dtype name: parameters} over the module's floating parameters (a tied one once), most
    first: what dtype "model" prices each in."""
    sizes = sorted(_dtype_sizes(model.parameters()).items(), key=lambda kv: -kv[1])
    return {_DTYPE_NAMES.get(d, str(d).replace("torch.", "")): n for d, n in sizes}


def main_dtype(model) -> torch.dtype:
    """The module's main floating dtype: the one most of its parameters hold (else its floating
    buffers'; else fp32). Under dtype "model" the floating inputs take it."""
    sizes = _dtype_sizes(model.parameters()) or _dtype_sizes(model.buffers())
    return max(sizes, key=sizes.get) if sizes else torch.float32


def main_dtype_name(model) -> str:
    """main_dtype as the kit prices it: fp32, fp16 or bf16 (float64 is priced as fp32)."""
    return {torch.float16: "fp16", torch.bfloat16: "bf16"}.get(main_dtype(model), "fp32")


def _kept_in_fp32(model, dtype: str | None):
    """Which parameters a cast to dtype leaves in fp32, by HF's class attributes:
    _keep_in_fp32_modules_strict under fp16 and bf16 (DeepSeek-V3's router weight and bias),
    _keep_in_fp32_modules under fp16 only (T5's wo). An entry names a module or a parameter
    path ("gate.weight") matched on whole dotted parts."""
    names = list(getattr(model, "_keep_in_fp32_modules_strict", None) or []) if dtype in ("fp16", "bf16") else []
    if dtype == "fp16":
        names += list(getattr(model, "_keep_in_fp32_modules", None) or [])
    return lambda name: any(f".{k}." in f".{name}." for k in names)


@contextmanager
def _swapped(model, params: dict, buffers: dict):
    """Temporarily give model the meta parameters and buffers (tied weights stay tied: every
    alias of one original tensor gets the same meta tensor); the originals come back after."""
    by_id = {}
    for n, p in model.named_parameters():
        by_id[id(p)] = params[n]
    for n, b in model.named_buffers():
        by_id[id(b)] = buffers[n]
    saved = []
    for mod in model.modules():
        for table in (mod._parameters, mod._buffers):
            for key, value in table.items():
                if value is not None and id(value) in by_id:
                    saved.append((table, key, value))
                    table[key] = by_id[id(value)]
    try:
        yield
    finally:
        for table, key, value in saved:
            table[key] = value


def _to_meta(t, dtype, grad: bool = False):
    """A meta tensor of t's shape, in dtype if t is floating; grad: it requires grad as t does
    (an input whose gradient the step computes, or that activation checkpointing needs)."""
    if not isinstance(t, torch.Tensor):
        return t
    d = dtype if (dtype is not None and t.is_floating_point()) else t.dtype
    grad = grad and t.requires_grad and (d.is_floating_point or d.is_complex)
    return torch.empty(t.shape, dtype=d, device="meta", requires_grad=grad)


@contextmanager
def _no_nested_tensors(model):
    """nn.TransformerEncoder without its nested-tensor path (taken in inference with a key-padding
    mask): the tokens it skips depend on the mask's values, which meta tensors do not hold, and
    its nested kernels have no meta implementation. Every token is costed instead."""
    off = [m for m in model.modules()
           if isinstance(m, torch.nn.TransformerEncoder) and getattr(m, "use_nested_tensor", False)]
    for m in off:
        m.use_nested_tensor = False
    try:
        yield
    finally:
        for m in off:
            m.use_nested_tensor = True


def _make_optimizer(optimizer, params):
    if optimizer is None or optimizer == "none":
        return None
    if callable(optimizer) and not isinstance(optimizer, str):
        return optimizer(params)
    name = str(optimizer).lower()
    if name == "adamw":
        return torch.optim.AdamW(params, lr=1e-4, foreach=True)  # CUDA's default implementation
    if name in ("adamw-fused", "adamw_fused"):
        return torch.optim.AdamW(params, lr=1e-4, fused=True)
    if name == "adam":
        return torch.optim.Adam(params, lr=1e-4, foreach=True)
    if name == "sgd":
        return torch.optim.SGD(params, lr=1e-2, momentum=0.9, foreach=True)
    raise KitError(f"unknown optimizer {optimizer!r}: choose adamw, adamw-fused, adam, sgd, none "
                   "or pass a callable(params) -> torch.optim.Optimizer")


@contextmanager
def _fused_on_meta():
    """Let fused optimizers (AdamW(fused=True)) take meta parameters: torch refuses devices
    without a fused kernel, but meta has one for shapes (aten._fused_adamw_)."""
    import torch.optim.optimizer as optim_base

    devices = getattr(optim_base, "_get_fused_kernels_supported_devices", None)
    if devices is None:
        yield
        return
    optim_base._get_fused_kernels_supported_devices = lambda: [*devices(), "meta"]
    try:
        yield
    finally:
        optim_base._get_fused_kernels_supported_devices = devices


def _optimizer_steps(rec: Recorder, optimizer, params) -> None:
    with _fused_on_meta():
        opt = _make_optimizer(optimizer, params)
        if opt is None:
            return
        rec.phase, rec.recording = "opt", False
        with rec:
            opt.step()  # the first step allocates the state: not the steady state
            rec.recording = True
            opt.step()


def capture_optimizer(model: torch.nn.Module, optimizer, dtype: str | None = None) -> list[Node]:
    """The steady-state optimizer step of model's trainable parameters alone (every gradient
    present), as "opt" nodes numbered from 0. Used when the forward and backward passes are
    captured on fewer layers than the model has. dtype: as capture's ("model" or None: each
    parameter in its own dtype; torch's foreach and fused optimizers run a kernel group per
    dtype)."""
    tdtype = TORCH_DTYPES.get(dtype) if dtype else None  # "model": each parameter's own
    params = []
    for p in {id(p): p for p in model.parameters()}.values():
        if p.requires_grad:
            meta = torch.nn.Parameter(_to_meta(p, tdtype))
            meta.grad = torch.empty_like(meta)
            params.append(meta)
    rec = Recorder()
    try:
        _optimizer_steps(rec, optimizer, params)
    except (RuntimeError, TypeError, ValueError) as e:
        raise KitError(f"optimizer step failed on meta tensors: {str(e).splitlines()[0]}") from None
    return rec.nodes


def _note_own_dtypes(model, name, dtype, sizes: dict) -> None:
    """Notes where the dtype asked (every parameter and floating input is cast to it) is not the
    one the module holds: float64 parameters (the kit has no FP64 kernel model), and a module
    mostly in bf16 or fp16 priced in fp32 or tf32, --dtype's default (a bf16 model had been priced
    as an fp32 one, its GEMMs off the tensor cores and twice the bytes, with only the header's
    dtype to say so). Either points to --dtype model too (each parameter in its own dtype)."""
    if dtype is None:
        return
    label = name or type(model).__name__  # sizes: param_dtypes(model)
    wide = sum(1 for _, p in model.named_parameters() if p.dtype == torch.float64)
    if wide:  # priced at dtype, as asked; an FP64 run is another matter
        asked = ("as fp32 ops (--dtype model)" if dtype == MODEL
                 else f"in {dtype}, as asked")
        warnings.warn(f"{label}: {wide} float64 parameter(s) are priced {asked}; the kit has no "
                      "FP64 kernel model, and FP64 runs slower: at half the FP32 rate on an A100 "
                      "or H100, a sixty-fourth on an L4 (NVIDIA datasheets)")
    short = next(iter(sizes), None)
    if short in ("bf16", "fp16") and dtype in ("fp32", "tf32"):
        mixed = len(sizes) > 1
        warnings.warn(f"{label}: its parameters are {'mostly ' * mixed}{short}, priced in {dtype} as "
                      f"asked (--dtype; the default is fp32): give --dtype {short} (dtype={short!r}) "
                      "to price the model in the dtype it holds, or --dtype model (dtype='model') "
                      "to keep each parameter in its own" + (f" ({', '.join(sizes)})" if mixed else ""))


def _mixed_hint(sizes: dict, dtype, err: KitError) -> KitError:
    """A capture failure on operands of two dtypes, of a module that holds parameters in several
    (sizes: param_dtypes, a bf16 body with an fp32 router fed h.float()) cast to one dtype:
    --dtype model keeps each its own."""
    if dtype == MODEL or len(sizes) < 2 or "dtype" not in str(err).lower():
        return err
    return KitError(f"{err}; the module holds parameters in several dtypes ({', '.join(sizes)}), "
                    f"which dtype {dtype!r} casts to one: --dtype model (dtype='model') keeps each "
                    "parameter in its own")


def capture(model: torch.nn.Module, inputs, *, mode: str = "train", optimizer=None,
            dtype: str | None = None, name: str | None = None, meta: dict | None = None,
            loss=None) -> OpGraph:
    """Run `model` on meta tensors and record its ops.

    inputs: a tuple of positional inputs, or a dict of keyword inputs (tensors of any device:
    only their shapes and dtypes are used). dtype: cast parameters and floating inputs to
    "fp32" | "tf32" | "fp16" | "bf16"; "model" (or None): keep each parameter and buffer in
    the dtype the module holds, every op priced in the dtype it runs in, with the floating inputs
    cast to the module's main dtype (main_dtype: the one most parameters hold) under "model"
    and kept as given under None. optimizer: None, "adamw", "adamw-fused",
    "adam", "sgd" or callable(params) (training only). loss: None (the backward starts from
    the outputs a loss over all of them would, kit.workload.capture_roots) or callable(first
    such output) -> the tensor to backpropagate from, recorded as part of the forward pass in
    module "loss" (training only; kit.workload.zoo.lm_loss). An input that requires grad keeps
    it: its gradient is part of the backward pass.
    """
    if not isinstance(model, torch.nn.Module):
        raise KitError(f"capture needs a torch.nn.Module, got {type(model).__name__}")
    if mode not in MODES:
        raise KitError(f"unknown mode {mode!r}: choose train or inference")
    check_dtype(dtype)
    tdtype = TORCH_DTYPES.get(dtype) if dtype is not None else None  # "model": None, each its own
    inputs_dtype = main_dtype(model) if dtype == MODEL else tdtype
    held = param_dtypes(model)  # before the meta parameters take their place
    _note_own_dtypes(model, name, dtype, held)
    train = mode == "train"
    # requires_grad stays the model's in inference too (it runs under no_grad): torch.matmul
    # folds a transposed 3-d input into one mm only when the weight requires grad
    kept = _kept_in_fp32(model, dtype)
    params = {n: torch.nn.Parameter(_to_meta(p, torch.float32 if kept(n) else tdtype), requires_grad=p.requires_grad)
              for n, p in model.named_parameters()}
    buffers = {n: _to_meta(b, torch.float32 if kept(n) else tdtype)
               for n, b in model.named_buffers()}
    args, kwargs = (((), dict(inputs)) if isinstance(inputs, dict) else
                    ((tuple(inputs) if isinstance(inputs, (list, tuple)) else (inputs,)), {}))
    args, kwargs = tree_map(lambda t: _to_meta(t, inputs_dtype, grad=train), (args, kwargs))

    rec = Recorder()
    names = {id(m): n for n, m in model.named_modules()}
    rec.param_path = {id(p): n.rsplit(".", 1)[0] if "." in n else "" for n, p in params.items()}
    saved: dict = {}
    # autograd saves weights too (a GEMM keeps W for dx): they are weights, not activations
    weights = {storage_key(t) for t in (*params.values(), *buffers.values())}

    def pre(mod, _args):
        rec.stack.append(names.get(id(mod), rec.stack[-1]))

    def post(mod, _args, _out):
        raised = sys.exc_info()[1]  # in flight when the module's forward raised (always_call)
        if raised is not None and (rec.raised_in is None or rec.raised_in[0] is not raised):
            rec.raised_in = (raised, rec.stack[-1])  # the innermost module it came from
        if len(rec.stack) > 1:
            rec.stack.pop()

    alive = []  # the saved storages, held so that none is freed and its address reused

    def pack(t):
        key = storage_key(t)
        if key in weights:
            return t
        nbytes_saved = t.untyped_storage().nbytes() if t.device.type == "meta" else 0
        saved[key] = (nbytes_saved, layer_of(rec.stack[-1]))
        alive.append(t.untyped_storage())
        return t

    handles = []
    was_training = model.training
    fast_taken, fast_declined = Counter(), Counter()
    stack = ExitStack()
    try:
        if not train:  # before the hooks below: a user's own hooks block the fast path
            stack.enter_context(fast_path.swapped(model, rec, names, fast_taken, fast_declined))
        for m in model.modules():
            handles.append(m.register_forward_pre_hook(pre))
            # always_call: a forward that raises still pops (checkpointing stops its recompute
            # early by raising inside the module)
            handles.append(m.register_forward_hook(post, always_call=True))
        model.train(train)
        grad_ctx = torch.enable_grad() if train else torch.no_grad()
        # the meta parameters stay in place through the backward: activation checkpointing
        # recomputes the forward there, which must see them (and the GPU's fused kernels)
        stack.enter_context(_swapped(model, params, buffers))
        stack.enter_context(hf_compat.answered())
        stack.enter_context(_no_nested_tensors(model))
        with grad_ctx, GpuKernels(rec), rec, torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), \
                kept_tensors() as kept:
            out = model(*args, **kwargs)
            # the tensors the model returns, the grown dynamic KV caches the next decode step
            # reads (kit.workload.kv_cache), and those the step made and left in its inputs (a
            # user's cache list it stores its torch.cat into): a fused chain writes them though
            # a member reads them (a [cat + repeat_kv clone] chain had written only the clones)
            returned = [rec.tensor_ids.get(storage_key(o)) for o in output_tensors(out) + kept]
            returned += [i for i in (rec.tensor_ids.get(storage_key(t))
                                     for t in output_tensors((args, kwargs))) if i is not None and i > 0]
            if train and loss is not None:
                rec.stack.append("loss")
                out = loss(backward_root(out))
                rec.stack.pop()
        if train:
            roots = backward_roots(out)
            rec.phase = "bwd"
            with GpuKernels(rec), rec:
                torch.autograd.backward(roots, seeds(roots))
            _optimizer_steps(rec, optimizer, [p for p in params.values() if p.requires_grad])
        elif optimizer not in (None, "none"):
            raise KitError("an optimizer step needs mode='train'")
    except KitError:
        raise
    except Exception as e:  # the user's forward: KeyError, AssertionError, AttributeError, ...
        raise _mixed_hint(held, dtype, capture_failure(name or type(model).__name__, e, rec,
                                                        _sparse_embeddings(model))) from None
    finally:
        for h in handles:
            h.remove()
        stack.close()
        model.train(was_training)

    nodes = rec.nodes if dtype != "tf32" else [_as_tf32(n) for n in rec.nodes]
    n_params = sum(p.numel() for p in params.values())  # tied weights once (named_parameters)
    param_bytes = sum(nbytes(p) for p in params.values())  # in the dtypes the capture ran them
    trainable = sum(nbytes(p) for p in params.values() if p.requires_grad)  # grads, optimizer state
    fwd_out = [n.out_bytes for n in rec.nodes if n.phase == "fwd"]
    info = {"params": int(n_params), "param_bytes": int(param_bytes),
            "trainable_param_bytes": int(trainable),
            "output_tensors": sorted({int(i) for i in returned if i is not None}),
            "buffer_bytes": int(sum(nbytes(b) for b in buffers.values())),
            "activation_bytes": int(sum(b for b, _ in saved.values()) if train else 2 * max(fwd_out, default=0)),
            "saved_bytes_by_layer": _by_layer(saved.values()),
            "mode": mode, "dtype": (dtype if dtype not in (None, MODEL) else main_dtype_name(model)),
            "optimizer":
            (optimizer if isinstance(optimizer, str) else getattr(optimizer, "__name__", "custom"))
            if optimizer is not None else None, "fusion": "eager"}
    if dtype == MODEL:  # each parameter in its own dtype: which, and how many parameters hold each
        info["model_dtypes"] = held
    if fast_taken or fast_declined:  # kit.workload.fast_path: torch's native inference kernels
        info["fast_path"] = {"taken": dict(fast_taken), "declined": dict(fast_declined)}
    info.update(meta or {})
    return OpGraph(tuple(nodes), name or type(model).__name__, info)


def _as_tf32(node: Node) -> Node:
    """TF32: fp32 storage, GEMMs and attention on tensor cores."""
    from dataclasses import replace

    from kit.ops import Attention, Gemm
    from kit.workload.kernels import Cheapest, Derived

    def tf32(op):
        if isinstance(op, (Gemm, Attention)) and op.dtype == "fp32":
            return replace(op, dtype="tf32")
        if isinstance(op, Derived):
            return replace(op, parts=tuple(tf32(p) for p in op.parts))
        if isinstance(op, Cheapest):  # every way to run it (a conv: implicit GEMM, Winograd)
            return replace(op, options=tuple(tf32(o) for o in op.options))
        return op

    op = tf32(node.op)
    return node if op == node.op else replace(node, op=op)


def _sparse_embeddings(model) -> set:
    """The module paths of the embeddings with a sparse gradient (sparse=True)."""
    kinds = (torch.nn.Embedding, torch.nn.EmbeddingBag)
    return {n for n, m in model.named_modules() if isinstance(m, kinds) and m.sparse}


def _by_layer(saved) -> dict:
    out: dict = {}
    for nbytes_saved, layer in saved:
        out[layer] = out.get(layer, 0) + int(nbytes_saved)
    return out
