"""The recorder behind kit.workload.capture: a TorchDispatchMode that turns every aten op a
model runs on meta tensors into a Node (kit.workload.graph) with its kit op (kit.workload.mapping),
its module path, and its dependencies by storage identity.

Meta kernels check shapes but not dtypes: a GEMM of an int64 tensor and a float weight (token ids
fed to an nn.Linear) runs on meta where a GPU refuses it. The recorder refuses it as torch does
(_check_gemm_dtypes), so the capture fails where the model would.
"""
from __future__ import annotations

import re
from contextlib import contextmanager

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from kit.errors import KitError
from kit.workload.capture_errors import _where
from kit.workload.graph import Node, Region, new_tensor_id
from kit.workload.mapping import SCATTERS_OUT_OF_PLACE, map_op, nbytes, tensors
from kit.workload.mapping_elementwise import unique_nbytes

_LAYER = re.compile(r"(?:^|\.)(\d+)(?:\.|$)")


_GROUPED_MM = torch.ops.aten._grouped_mm.default
# the GEMM family: cuBLAS takes operands of one dtype (a bias too), and so does torch, which meta
# kernels do not check (torch.matmul, F.linear and nn.Bilinear come here as these)
_SAME_DTYPE = {"mm", "addmm", "_addmm_activation", "bmm", "baddbmm", "addbmm", "mv", "addmv",
               "dot", "vdot", "_trilinear"}


def _check_gemm_dtypes(packet: str, args, overload: str = "") -> None:
    """RuntimeError, as torch's, for a GEMM whose operands' dtypes differ (int64 token ids fed to
    a float nn.Linear), which a meta kernel would run. The out_dtype overloads (aten.addmm.dtype:
    bf16 operands, an fp32 bias and output) mix dtypes by design and are left to torch."""
    if packet not in _SAME_DTYPE or "dtype" in overload:
        return
    dtypes = list(dict.fromkeys(t.dtype for t in tensors(args)))
    if len(dtypes) > 1:
        names = " and ".join(str(d).removeprefix("torch.") for d in dtypes)
        raise RuntimeError(f"operands of different dtypes ({names}), which torch refuses (a GEMM's "
                           "operands must have the same dtype)")


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


def layer_of(path: str) -> int | None:
    """First numeric component of a module path: "transformer.h.3.attn" -> 3."""
    m = _LAYER.search(path)
    return int(m.group(1)) if m else None


def storage_key(t: torch.Tensor):
    try:
        return t.untyped_storage()._cdata
    except (RuntimeError, NotImplementedError):
        return id(t)


def _shape_text(ins) -> str:
    return "x".join("[" + ",".join(str(s) for s in t.shape) + "]" for t in ins[:4])


# ops that make a zero-filled tensor: the start of autograd's scatter-shaped gradients
_ZERO_FILLS = {"new_zeros", "zeros_like", "zeros", "zero_", "full", "new_full", "full_like", "fill_"}

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


class Recorder(TorchDispatchMode):
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
            _check_gemm_dtypes(getattr(func, "_opname", ""), args, getattr(func, "_overloadname", ""))
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
                self.writers.pop(storage_key(t), None)
                self.tensor_ids.pop(storage_key(t), None)
        return out

    def _record(self, func, args, kwargs, out):
        ins = tensors(args) + tensors(kwargs)
        outs = tensors(out)
        if not any(t.device.type == "meta" for t in ins + outs):
            return  # host-side bookkeeping (optimizer step counters, ...): no GPU kernel
        name = str(func)  # "aten.mm.default"
        packet = name.split(".")[1] if name.startswith("aten.") else name
        given = _without_outs(func, kwargs)  # an out= tensor is written, not read: out has it
        copies = packet not in SCATTERS_OUT_OF_PLACE or self._copies_self(args)
        if "attention" in packet:  # name the arguments (is_causal sits at different positions)
            given = {**{a.name: v for a, v in zip(func._schema.arguments, args)}, **given}
        try:
            op, op_class, kernels = map_op(packet, args, given, out, copies_self=copies)
        except KitError as e:  # an op the kit refuses (a convolution of zero-size tensors, ...):
            # name the module it ran in, as a failure of the forward is named (capture_errors)
            raise KitError(f"{e} ({_where(self.phase, self._path()).strip()})") from None
        read, written = _accesses(func, packet, args, kwargs, ins) if op is not None else (ins, ())
        self._add(name, op, op_class, kernels, ins, outs, self._path(), read, written)

    def _copies_self(self, args) -> bool:
        """Whether an out-of-place scatter (x.scatter(...), index_put, index_add, scatter_add)
        copies its self into its output, as CUDA runs it. Not in autograd's backward formulas
        that fill a fresh zeros tensor (gather's, index's and index_select's gradients): CUDA
        runs scatter_add_, index_put_ or index_add_ on it in place, and they take the
        out-of-place forms only because the capture's dispatch mode makes the tensors look like
        subclasses (areAnyTensorSubclassLike). The model's own code (its forward, activation
        checkpointing's recompute: grad mode on, or its module running) copies, and so do the
        backward formulas that scatter into a copy of the gradient (scatter's: grad.scatter(dim,
        index, 0); index_put's)."""
        if self.phase != "bwd" or len(self.stack) > 1 or torch.is_grad_enabled():
            return True
        target = args[0] if args and isinstance(args[0], torch.Tensor) else None
        writers = self.writers.get(storage_key(target), ()) if target is not None else ()
        return not (len(writers) == 1 and writers[0] < len(self.nodes)
                    and self.nodes[writers[0]].aten.split(".")[1] in _ZERO_FILLS)

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
        (its unique elements', capped at the storage's)."""
        tid = self.tensor_ids.get(key)
        if tid is None:  # made by no recorded op: it outlives the step (negative id, Region)
            tid = self.tensor_ids[key] = -new_tensor_id()
        # an expanded view reads the elements it was expanded from: table[:1].expand(4096, 256)
        # of an 8192 x 256 fp32 buffer had counted 4 MiB where a 1 KiB row is read
        size, own = t.element_size(), unique_nbytes(t)
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
            deps.update(self.writers.get(storage_key(t), ()))
        nid = len(self.nodes)
        kernel = op is not None
        # tensor-level reads, before the outputs below give fresh storages new ids
        reads = () if not kernel else tuple(dict.fromkeys(
            self._region(t, storage_key(t)) for t in (ins if read is None else read)
            if t.device.type == "meta"))
        in_keys = {storage_key(t) for t in ins}
        writes = []
        for t in outs:
            key = storage_key(t)
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
                writes.append(self._region(t, storage_key(t)))
        self.nodes.append(Node(nid, name, op, op_class, self.phase, tuple(sorted(deps)), path,
                               layer_of(path), sum(nbytes(t) for t in outs) if kernel else 0,
                               _shape_text(ins), kernels, reads=reads,
                               writes=tuple(dict.fromkeys(writes))))

