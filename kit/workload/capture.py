"""Capture any torch model into an op graph, on meta tensors: no memory, no GPU.

    graph = capture(model, inputs, mode="train", optimizer="adamw")

The model runs under a TorchDispatchMode that records every aten op with its shapes and dtypes.
Parameters and inputs are replaced by meta tensors of the same shapes (torch.func.functional_call),
so a 175B-parameter model captures in a laptop's memory and the user's module is left untouched.

* inference: one forward pass under no_grad, modules in eval mode;
* train: forward (train mode: dropout on) + backward from the model's output, then optionally one
  optimizer step (the steady-state step: the state-allocating first step is run unrecorded).

Dependencies come from tensor identity: each storage remembers the node(s) that last wrote it, and
an op depends on the writers of every storage it reads. (A tensor made outside any recorded op,
such as torch.tensor(3.0), may inherit a stale writer if its storage reuses a freed one's
address: a spurious edge to an earlier node, never a missing one.) Module paths come from module hooks in the
forward pass and, in the backward pass, from the autograd node being run (its sequence number
links it to the forward op that created it).

F.scaled_dot_product_attention is routed to the fused kernel a GPU would pick (memory-efficient
attention for fp32, flash attention for fp16/bf16 without a mask), so it is costed as one
attention kernel rather than the math fallback that meta tensors would take.
"""
from __future__ import annotations

import re
import sys
from collections import Counter
from contextlib import ExitStack, contextmanager

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves, tree_map

from kit.errors import KitError, one_line
from kit.workload import fast_path, hf_compat, rnn_capture
from kit.workload.graph import Node, OpGraph, Region, new_tensor_id
from kit.workload.mapping import map_op, nbytes, tensors

MODES = ("train", "inference")
TORCH_DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16,
                "tf32": torch.float32}
_LAYER = re.compile(r"(?:^|\.)(\d+)(?:\.|$)")
# aten ops whose output size, or a host value, depends on the tensor's data: meta tensors hold
# none, so a capture cannot run them (boolean-mask indexing and torch.where(cond) are nonzero;
# .item(), bool(t) and int(t) are _local_scalar_dense)
DATA_DEPENDENT = ("nonzero", "argwhere", "masked_select", "_unique", "unique_dim",
                  "unique_consecutive", "bincount", "_local_scalar_dense", "repeat_interleave",
                  "histc", "equal", "is_nonzero")
# in torch's message when the failed op is not one of those (indexing with a mask, .tolist(), ...)
_NEEDS_VALUES = ("nonzero()", "data-dependent", "to numpy", "item() cannot be called on meta",
                 "copy out of meta tensor")


def _caused(exc: BaseException, e: BaseException) -> bool:
    """Whether exc is e or in the chain that raised e (a failure the forward caught and went
    on from is not)."""
    seen = set()
    while e is not None and id(e) not in seen:
        if e is exc:
            return True
        seen.add(id(e))
        e = e.__cause__ or e.__context__
    return False


def _where(phase: str, path: str) -> str:
    if phase == "bwd":
        return f" in the backward pass of module {path!r}" if path else " in the backward pass"
    if phase == "opt":
        return " in the optimizer step"
    return f" in module {path!r}" if path else " in its top-level forward"


def _kept_in_fp32(model, dtype: str | None):
    """Which parameters a cast to dtype leaves in fp32, by HF's class attributes:
    _keep_in_fp32_modules_strict under fp16 and bf16 (DeepSeek-V3's router weight and bias),
    _keep_in_fp32_modules under fp16 only (T5's wo). An entry names a module or a parameter
    path ("gate.weight") matched on whole dotted parts."""
    names = list(getattr(model, "_keep_in_fp32_modules_strict", None) or []) if dtype in ("fp16", "bf16") else []
    if dtype == "fp16":
        names += list(getattr(model, "_keep_in_fp32_modules", None) or [])
    return lambda name: any(f".{k}." in f".{name}." for k in names)


_GROUPED_MM = torch.ops.aten._grouped_mm.default


def _grouped_mm_any_dtype(func, args, kwargs):
    """torch's meta kernel of _grouped_mm takes bf16 (or scaled fp8) operands only, the CUTLASS
    kernel's types; a grouped GEMM of fp32 or fp16 operands (HF's MoE experts in those dtypes)
    gets its output shape from bf16 stand-ins and keeps its own dtype."""
    a, b = args[0], args[1]
    if a.dtype == b.dtype == torch.bfloat16 or a.element_size() == 1:
        return func(*args, **kwargs)
    named = {arg.name: value for arg, value in zip(func._schema.arguments, args)}
    named.update(kwargs)
    out_dtype = named.get("out_dtype") or a.dtype
    named.update(self=a.to(torch.bfloat16), mat2=b.to(torch.bfloat16), out_dtype=None)
    return func(**named).to(out_dtype)


class DataDependentCapture(KitError):
    """A model's forward ran an op whose output depends on the tensor's values."""


# what torch says when code asks for a CUDA device on a machine without one
# (or, on a machine with one, a CUDA tensor meeting the capture's meta ones)
_NEEDS_GPU = ("Torch not compiled with CUDA enabled", "Found no NVIDIA driver",
              "No CUDA GPUs are available", "CUDA driver initialization failed",
              "Tensor on device cuda")


def _capture_failure(name: str, e: Exception, rec) -> KitError:
    """The one-line KitError for a forward that raised: the aten op and module it failed in
    (rec.failed, when that failure is what raised e; else the module running), and for an op
    that needs the tensor's values what to do about it."""
    msg = one_line(e, with_type=not isinstance(
        e, (RuntimeError, TypeError, ValueError, IndexError, NotImplementedError)))
    running = rec.raised_in[1] if rec.raised_in is not None and rec.raised_in[0] is e else rec.stack[-1]
    op, at = None, _where(rec.phase, running if rec.phase == "fwd" else "")
    if rec.failed is not None and _caused(rec.failed[3], e):
        op, at = rec.failed[0], _where(rec.failed[1], rec.failed[2])
    packet = op.split(".")[1] if op and op.startswith("aten.") else ""
    dependent = packet.startswith(DATA_DEPENDENT) or any(k in msg for k in _NEEDS_VALUES)
    if dependent:
        return DataDependentCapture(
            f"capturing {name} failed{at}: {op or 'an op'} needs the tensor's values (boolean-mask "
            "indexing, torch.where(cond), nonzero, unique, .item() or if/int/bool on a tensor), "
            "and the capture runs on meta tensors, which hold none; give that code static "
            "shapes (for mixture-of-experts routing, a fixed number of tokens per expert, "
            f"chosen by topk as the zoo's MoE does) [torch: {msg.split('. ')[0]}]")
    if any(k in msg for k in _NEEDS_GPU):  # the model's own code asked for a CUDA device
        return KitError(f"capturing {name} failed{at}: the model puts a tensor on a CUDA device "
                        f"itself (.cuda(), .to('cuda') or device='cuda'), and the capture runs on "
                        f"meta tensors, without a GPU: create it on an input's device "
                        f"(device=x.device) [torch: {msg}]")
    return KitError(f"capturing {name} failed{at}{' at ' + op if op else ''}: {msg} (inputs "
                    "must match the model's forward)")


def layer_of(path: str) -> int | None:
    """First numeric component of a module path: "transformer.h.3.attn" -> 3."""
    m = _LAYER.search(path)
    return int(m.group(1)) if m else None


def _storage_key(t: torch.Tensor):
    try:
        return t.untyped_storage()._cdata
    except (RuntimeError, NotImplementedError):
        return id(t)


def _shape_text(ins) -> str:
    return "x".join("[" + ",".join(str(s) for s in t.shape) + "]" for t in ins[:4])


# in-place ops that overwrite their first argument without reading it
_OVERWRITES = {"copy_", "fill_", "zero_", "bernoulli_", "uniform_", "normal_", "random_",
               "exponential_", "geometric_", "cauchy_", "log_normal_", "index_copy_"}


def _accesses(func, packet: str, args, kwargs, ins: list) -> tuple[list, list]:
    """(read, written): the tensors among an op's inputs (ins) whose values it reads (not its
    out= arguments, nor the target an overwriting in-place op such as copy_ or fill_ writes
    without reading), and those its schema says it writes in place (Tensor(a!): self of add_,
    the lists of a _foreach_*_ op, which returns nothing)."""
    written, unread = [], []
    try:
        schema = func._schema.arguments
    except AttributeError:
        schema = ()
    for i, a in enumerate(schema):
        if a.alias_info is not None and a.alias_info.is_write:
            value = tensors(args[i] if i < len(args) else kwargs.get(a.name))
            written += value
            if a.is_out or (i == 0 and packet in _OVERWRITES):
                unread += value
    if not unread:
        return ins, written
    skip = {id(t) for t in unread}
    return [t for t in ins if id(t) not in skip], written


def _without_outs(func, kwargs: dict) -> dict:
    """kwargs less the out= arguments of func's schema (keyword-only: out, or values and
    indices of aten.sort.values, ...), which an op writes and returns without reading them."""
    try:
        outs = {a.name for a in func._schema.arguments if a.is_out}
    except AttributeError:
        return kwargs
    return {k: v for k, v in kwargs.items() if k not in outs} if outs else kwargs


class _Recorder(TorchDispatchMode):
    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        # capture never runs under torch.compile; skipping the dynamo wrapper avoids importing
        # torch._dynamo on the first op (seconds on a small machine)
        return False

    def __init__(self):
        super().__init__()
        self.nodes: list[Node] = []
        self.writers: dict = {}
        self.phase = "fwd"
        self.recording = True
        self.stack = [""]
        self.seq_path: dict[int, str] = {}
        self.param_path: dict[int, str] = {}
        self.failed: tuple | None = None  # (aten op, phase, module path, exception): the last failure
        self.raised_in: tuple | None = None  # (exception, module path): where a forward raised
        self.tensor_ids: dict = {}  # storage -> the id of the tensor it holds now (Region.tensor)
        self.regions: dict = {}  # one Region object per distinct region (shared by its readers)

    def _path(self) -> str:
        if self.phase == "fwd":
            path = self.stack[-1]
            self.seq_path.setdefault(torch.autograd._get_sequence_nr() - 1, path)
            return path
        if self.phase == "bwd":
            if len(self.stack) > 1:  # a module's forward run again in the backward: activation
                path = self.stack[-1]  # checkpointing's recompute, named by its module hooks
                self.seq_path.setdefault(torch.autograd._get_sequence_nr() - 1, path)
                return path
            node = torch._C._current_autograd_node()
            if node is None:
                return ""
            if type(node).__name__ == "AccumulateGrad":
                return self.param_path.get(id(getattr(node, "variable", None)), "")
            seq = node._sequence_nr()
            # an in-place op on a view (CopySlices) gets its node after the forward recorded the
            # op: its number is missing, and the op recorded just before it ran in its module
            for nr in range(seq, max(seq - 8, -1), -1):
                if nr in self.seq_path:
                    return self.seq_path[nr]
            return ""
        return "optimizer"

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        try:
            out = _grouped_mm_any_dtype(func, args, kwargs) if func is _GROUPED_MM else func(*args, **kwargs)
        except Exception as exc:
            if self.failed is None or self.failed[3] is not exc:  # the innermost op that failed
                path = self.stack[-1] if self.phase == "fwd" else self._path()
                self.failed = (str(func), self.phase, path, exc)
            raise
        if self.recording:
            self._record(func, args, kwargs, out)
        else:  # unrecorded (the optimizer's first step): forget what its outputs' storages held
            for t in tensors(out):
                self.writers.pop(_storage_key(t), None)
                self.tensor_ids.pop(_storage_key(t), None)
        return out

    def _record(self, func, args, kwargs, out):
        ins = tensors(args) + tensors(kwargs)
        outs = tensors(out)
        if not any(t.device.type == "meta" for t in ins + outs):
            return  # host-side bookkeeping (optimizer step counters, ...): no GPU kernel
        name = str(func)  # "aten.mm.default"
        packet = name.split(".")[1] if name.startswith("aten.") else name
        given = _without_outs(func, kwargs)  # an out= tensor is written, not read: out has it
        if "attention" in packet:  # name the arguments (is_causal sits at different positions)
            named = {a.name: v for a, v in zip(func._schema.arguments, args)}
            op, op_class, kernels = map_op(packet, args, {**named, **given}, out)
        else:
            op, op_class, kernels = map_op(packet, args, given, out)
        read, written = _accesses(func, packet, args, kwargs, ins) if op is not None else (ins, ())
        self._add(name, op, op_class, kernels, ins, outs, self._path(), read, written)

    @contextmanager
    def muted(self):
        """Run ops without recording them (a library call recorded as one node instead)."""
        was, self.recording = self.recording, False
        try:
            yield
        finally:
            self.recording = was

    @contextmanager
    def within(self, path: str):
        """Record ops as run by the module at `path` (a submodule run without its own call, as
        kit.workload.fast_path runs torch's native kernels)."""
        self.stack.append(path)
        try:
            yield
        finally:
            self.stack.pop()

    def record_fused(self, name: str, op, op_class: str, kernels: int, ins, outs,
                     path: str | None = None):
        """Record one node that stands for a library call whose own ops ran unrecorded
        (kit.workload.rnn_capture); path defaults to the current module's."""
        if self.recording:
            self._add(name, op, op_class, kernels, ins, outs, self._path() if path is None else path)

    def _region(self, t: torch.Tensor, key) -> Region:
        """The Region of t: its storage's tensor id (a first sight, as of a parameter, an
        input or an optimizer state, gets a negative one), its byte offset and its own bytes
        (capped at the storage's)."""
        tid = self.tensor_ids.get(key)
        if tid is None:  # made by no recorded op: it outlives the step (negative id, Region)
            tid = self.tensor_ids[key] = -new_tensor_id()
        size, own = t.element_size(), nbytes(t)
        try:
            storage, offset = t.untyped_storage().nbytes(), t.storage_offset() * size
        except (RuntimeError, NotImplementedError):  # no storage (as _storage_key)
            storage, offset = own, 0
        region = Region(tid, offset, min(own, storage), storage)
        return self.regions.setdefault(region, region)

    def _add(self, name, op, op_class, kernels, ins, outs, path, read=None, written=()):
        """Record one node. read: the inputs whose values it reads (default all of ins; an
        out= argument or the target of copy_/fill_ is written, not read); written: inputs it
        writes in place, returned or not (only its tensor records see those: its dependencies
        come from the storages of its outputs)."""
        deps = set()
        for t in ins:
            deps.update(self.writers.get(_storage_key(t), ()))
        nid = len(self.nodes)
        kernel = op is not None
        # tensor-level reads, before the outputs below give fresh storages new ids
        reads = () if not kernel else tuple(dict.fromkeys(
            self._region(t, _storage_key(t)) for t in (ins if read is None else read)
            if t.device.type == "meta"))
        in_keys = {_storage_key(t) for t in ins}
        writes = []
        for t in outs:
            key = _storage_key(t)
            if key not in in_keys:  # fresh storage (also from free ops: allocation, lift_fresh)
                self.writers[key] = (nid,)
                self.tensor_ids[key] = new_tensor_id()
            elif kernel:  # an in-place or out= write into an input's storage
                partial = t.numel() < t.untyped_storage().nbytes() // max(t.element_size(), 1)
                self.writers[key] = (tuple(self.writers.get(key, ())) + (nid,)) if partial else (nid,)
            # a view aliases its input's storage: the writers stay the same
            if kernel and t.device.type == "meta":
                writes.append(self._region(t, key))
        returned = {id(t) for t in outs}
        for t in written:  # in place and not returned (a _foreach_*_ op's lists)
            if id(t) not in returned and t.device.type == "meta":
                writes.append(self._region(t, _storage_key(t)))
        self.nodes.append(Node(nid, name, op, op_class, self.phase, tuple(sorted(deps)), path,
                               layer_of(path), sum(nbytes(t) for t in outs) if kernel else 0,
                               _shape_text(ins), kernels, reads=reads,
                               writes=tuple(dict.fromkeys(writes))))


class _GpuKernels(TorchFunctionMode):
    """Route F.scaled_dot_product_attention, dropout and recurrent layers to the fused kernels a
    GPU would run (recurrent layers: kit.workload.rnn_capture, recorded through `rec`)."""

    def __init__(self, rec: "_Recorder"):
        super().__init__()
        self.rec = rec

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is F.scaled_dot_product_attention:
            return _fused_sdpa(*args, **kwargs)
        if func is F.dropout:  # a GPU runs the fused native_dropout kernel
            return _fused_dropout(*args, **kwargs)
        if func in rnn_capture.SEQUENCE or func in rnn_capture.CELLS:
            out = rnn_capture.fused(self.rec, func, args, kwargs)
            if out is not NotImplemented:
                return out
        if getattr(func, "__module__", None) == F.__name__:  # this mode is off while func runs:
            with _functional_fused():  # F.multi_head_attention_forward's own SDPA and dropout
                return func(*args, **kwargs)  # calls must still reach the fused kernels
        return func(*args, **kwargs)


@contextmanager
def _functional_fused():
    """Point torch.nn.functional's own names scaled_dot_product_attention and dropout at the
    fused kernels a GPU runs, for the duration of one composite functional call. Such a call
    (nn.MultiheadAttention's F.multi_head_attention_forward, under nn.Transformer* too) runs
    with _GpuKernels off, so its inner calls by module-global name were the CPU's: math
    attention, upcast to fp32 in 16-bit dtypes, and an unfused dropout."""
    saved = F.scaled_dot_product_attention, F.dropout
    F.scaled_dot_product_attention, F.dropout = _fused_sdpa, _fused_dropout
    try:
        yield
    finally:
        F.scaled_dot_product_attention, F.dropout = saved


def _fused_dropout(input, p=0.5, training=True, inplace=False):
    if not training or p == 0:
        return input
    return torch.native_dropout(input, p, True)[0]


def _fused_sdpa(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                enable_gqa=False):
    # flash attention needs one head size for q, k and v: values of their own width (DeepSeek's
    # MLA) go to the memory-efficient kernel, as torch's dispatcher sends them
    flash = (q.dtype in (torch.float16, torch.bfloat16) and attn_mask is None
             and v.shape[-1] == q.shape[-1])
    if k.shape[-3] != q.shape[-3]:  # grouped-query attention
        if q.shape[-3] % k.shape[-3]:
            raise KitError(f"attention: {q.shape[-3]} query heads are not a multiple of "
                           f"{k.shape[-3]} key/value heads")
        if not (flash and enable_gqa):  # only flash attention reads grouped K/V heads as they
            rep = q.shape[-3] // k.shape[-3]  # are (torch's SDPA docs, "GQA"); the rest repeat
            k, v = k.repeat_interleave(rep, dim=-3), v.repeat_interleave(rep, dim=-3)
    if flash:
        return torch.ops.aten._scaled_dot_product_flash_attention(
            q, k, v, dropout_p, is_causal, False, scale=scale)[0]
    need_lse = torch.is_grad_enabled() and q.requires_grad
    return torch.ops.aten._scaled_dot_product_efficient_attention(
        q, k, v, attn_mask, need_lse, dropout_p, is_causal, scale=scale)[0]


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


def _to_meta(t, dtype):
    if not isinstance(t, torch.Tensor):
        return t
    d = dtype if (dtype is not None and t.is_floating_point()) else t.dtype
    return torch.empty(t.shape, dtype=d, device="meta")


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


def _optimizer_steps(rec: "_Recorder", optimizer, params) -> None:
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
    captured on fewer layers than the model has."""
    tdtype = TORCH_DTYPES.get(dtype) if dtype else None
    params = []
    for p in {id(p): p for p in model.parameters()}.values():
        if p.requires_grad:
            meta = torch.nn.Parameter(_to_meta(p, tdtype))
            meta.grad = torch.empty_like(meta)
            params.append(meta)
    rec = _Recorder()
    try:
        _optimizer_steps(rec, optimizer, params)
    except (RuntimeError, TypeError, ValueError) as e:
        raise KitError(f"optimizer step failed on meta tensors: {str(e).splitlines()[0]}") from None
    return rec.nodes


def _output_tensors(output) -> list:
    """Tensors in a model's output: pytree leaves, and the fields of a dataclass (a user's own
    output class, which pytree does not open)."""
    import dataclasses

    out = []
    for leaf in tree_leaves(output):
        if isinstance(leaf, torch.Tensor):
            out.append(leaf)
        elif dataclasses.is_dataclass(leaf) and not isinstance(leaf, type):
            out += _output_tensors([getattr(leaf, f.name) for f in dataclasses.fields(leaf)])
    return out


def _grad_outputs(output) -> list:
    """The floating tensors of a model's output that require grad, in order."""
    return [t for t in _output_tensors(output) if t.is_floating_point() and t.requires_grad]


def _backward_root(output):
    roots = _grad_outputs(output)
    if roots:
        return roots[0]
    raise KitError("training capture: the model's output has no floating tensor that requires "
                   f"grad (it returned a {type(output).__name__}; does the model have trainable "
                   "parameters on the output's path?)")


def capture(model: torch.nn.Module, inputs, *, mode: str = "train", optimizer=None,
            dtype: str | None = None, name: str | None = None, meta: dict | None = None,
            loss=None) -> OpGraph:
    """Run `model` on meta tensors and record its ops.

    inputs: a tuple of positional inputs, or a dict of keyword inputs (tensors of any device:
    only their shapes and dtypes are used). dtype: cast parameters and floating inputs to
    "fp32" | "fp16" | "bf16" (None: keep the model's). optimizer: None, "adamw", "adamw-fused",
    "adam", "sgd" or callable(params) (training only). loss: None (the backward starts from
    every floating output that requires grad, as from a loss summing them) or callable(first
    such output) -> the tensor to backpropagate from, recorded as part of the forward pass in
    module "loss" (training only; kit.workload.zoo.lm_loss).
    """
    if not isinstance(model, torch.nn.Module):
        raise KitError(f"capture needs a torch.nn.Module, got {type(model).__name__}")
    if mode not in MODES:
        raise KitError(f"unknown mode {mode!r}: choose train or inference")
    tdtype = None
    if dtype is not None:
        if not isinstance(dtype, str) or dtype not in TORCH_DTYPES:
            raise KitError(f"unknown dtype {dtype!r}: choose one of {', '.join(TORCH_DTYPES)}")
        tdtype = TORCH_DTYPES[dtype]
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
    args, kwargs = tree_map(lambda t: _to_meta(t, tdtype), (args, kwargs))

    rec = _Recorder()
    names = {id(m): n for n, m in model.named_modules()}
    rec.param_path = {id(p): n.rsplit(".", 1)[0] if "." in n else "" for n, p in params.items()}
    saved: dict = {}

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
        nbytes_saved = t.untyped_storage().nbytes() if t.device.type == "meta" else 0
        saved[_storage_key(t)] = (nbytes_saved, layer_of(rec.stack[-1]))
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
        with grad_ctx, _GpuKernels(rec), rec, torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            out = model(*args, **kwargs)
            if train and loss is not None:
                rec.stack.append("loss")
                out = loss(_backward_root(out))
                rec.stack.pop()
        if train:
            # from every output that requires grad, as a loss summing them would (BERT's
            # pretraining heads): each node's backward still runs once. A model that returns
            # its loss (HF's {"loss", "logits"}; a MoE's auxiliary losses) backpropagates from
            # its scalar outputs alone: the logits beside the loss take no gradient of their own
            roots = _grad_outputs(out) or [_backward_root(out)]  # none: the error naming it
            scalars = [r for r in roots if r.numel() == 1]
            roots = scalars or roots
            rec.phase = "bwd"
            with _GpuKernels(rec), rec:
                torch.autograd.backward(roots, [None if r.numel() == 1 else torch.empty_like(r)
                                                for r in roots])
            _optimizer_steps(rec, optimizer, [p for p in params.values() if p.requires_grad])
        elif optimizer not in (None, "none"):
            raise KitError("an optimizer step needs mode='train'")
    except KitError:
        raise
    except Exception as e:  # the user's forward: KeyError, AssertionError, AttributeError, ...
        raise _capture_failure(name or type(model).__name__, e, rec) from None
    finally:
        for h in handles:
            h.remove()
        stack.close()
        model.train(was_training)

    nodes = rec.nodes if dtype != "tf32" else [_as_tf32(n) for n in rec.nodes]
    n_params = sum(p.numel() for p in params.values())  # tied weights once (named_parameters)
    param_bytes = sum(nbytes(p) for p in params.values())  # in the dtypes the capture ran them
    fwd_out = [n.out_bytes for n in rec.nodes if n.phase == "fwd"]
    info = {"params": int(n_params), "param_bytes": int(param_bytes),
            "buffer_bytes": int(sum(nbytes(b) for b in buffers.values())),
            "activation_bytes": int(sum(b for b, _ in saved.values()) if train else 2 * max(fwd_out, default=0)),
            "saved_bytes_by_layer": _by_layer(saved.values()),
            "mode": mode, "dtype": dtype or _dtype_name(params), "optimizer":
            (optimizer if isinstance(optimizer, str) else getattr(optimizer, "__name__", "custom"))
            if optimizer is not None else None, "fusion": "eager"}
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


def _by_layer(saved) -> dict:
    out: dict = {}
    for nbytes_saved, layer in saved:
        out[layer] = out.get(layer, 0) + int(nbytes_saved)
    return out


def _dtype_name(params) -> str:
    for p in params.values():
        if p.is_floating_point():
            return {torch.float16: "fp16", torch.bfloat16: "bf16"}.get(p.dtype, "fp32")
    return "fp32"
