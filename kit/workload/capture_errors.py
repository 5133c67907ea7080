"""What a failed capture tells the user: one line naming the aten op, the module and the pass
it failed in, and for the usual causes (code that needs a tensor's values, a model that asks for a
CUDA device itself) what to do about it."""
from __future__ import annotations

from kit.errors import KitError, one_line

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


class CaptureNotAboutInputs(KitError):
    """A capture failure that the model's own code causes whatever inputs it is given (it asks
    for a CUDA device, makes a tensor on the CPU, needs a tensor's values, has nothing to train):
    a note on the inputs the kit fed it (kit.workload.models) would mislead."""


class DataDependentCapture(CaptureNotAboutInputs):
    """A model's forward ran an op whose output depends on the tensor's values."""


# what torch says when code asks for a CUDA device on a machine without one
# (or, on a machine with one, a CUDA tensor meeting the capture's meta ones)
_NEEDS_GPU = ("Torch not compiled with CUDA enabled", "Found no NVIDIA driver",
              "No CUDA GPUs are available", "CUDA driver initialization failed",
              "Tensor on device cuda")
# what torch says when a CPU tensor meets the capture's meta ones (torch.ones(16) made in the
# forward without device=x.device: on a GPU it would meet CUDA tensors, which torch refuses too)
_CPU_TENSOR = ("Tensor on device cpu is not on the expected device meta",
               "found at least two devices, meta and cpu", "found at least two devices, cpu and meta")


def _in_packed_sequences(e: BaseException) -> bool:
    """Whether e was raised in torch.nn.utils.rnn (pack_padded_sequence, pad_packed_sequence)."""
    tb = e.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code.co_filename.replace("\\", "/").endswith("torch/nn/utils/rnn.py"):
            return True
        tb = tb.tb_next
    return False


def capture_failure(name: str, e: Exception, rec, sparse=()) -> KitError:
    """The one-line KitError for a forward that raised: the aten op and module it failed in
    (rec.failed, when that failure is what raised e; else the module running), and for an op
    that needs the tensor's values what to do about it. sparse: the module paths of embeddings
    with sparse=True (their backward needs the ids' values)."""
    msg = one_line(e, with_type=not isinstance(
        e, (RuntimeError, TypeError, ValueError, IndexError, NotImplementedError)))
    running = rec.raised_in[1] if rec.raised_in is not None and rec.raised_in[0] is e else rec.stack[-1]
    op, at = None, _where(rec.phase, running if rec.phase == "fwd" else "")
    if rec.failed is not None and _caused(rec.failed[3], e):
        op, at = rec.failed[0], _where(rec.failed[1], rec.failed[2])
    packet = op.split(".")[1] if op and op.startswith("aten.") else ""
    dependent = packet.startswith(DATA_DEPENDENT) or any(k in msg for k in _NEEDS_VALUES)
    # only a failure that needs the lengths' values: a user's own error in the packing (more
    # lengths than sequences, say) keeps torch's message and the op it failed in
    if _in_packed_sequences(e) and (dependent or "meta" in msg):
        return DataDependentCapture(
            f"capturing {name} failed{at}: a packed sequence needs its lengths' values on the "
            "host, and the capture moves every input tensor to the meta device, which holds "
            "none; give the lengths as a Python list, sorted longest first, with "
            f"enforce_sorted=True (the same kernels, less the sort's two gathers) [torch: {msg}]")
    if dependent and rec.failed is not None and rec.failed[1] == "bwd" and rec.failed[2] in sparse:
        return DataDependentCapture(
            f"capturing {name} failed{at}: an embedding with sparse=True makes a sparse gradient "
            "whose rows depend on the ids' values (padding_idx drops the padding rows by value), "
            "and the capture runs on meta tensors, which hold none; capture it with sparse=False "
            f"(a dense gradient, the bound a sparse one stays under) [torch: {msg.split('. ')[0]}]")
    if dependent:
        return DataDependentCapture(
            f"capturing {name} failed{at}: {op or 'an op'} needs the tensor's values (boolean-mask "
            "indexing, torch.where(cond), nonzero, unique, .item() or if/int/bool on a tensor), "
            "and the capture runs on meta tensors, which hold none; give that code static "
            "shapes (for mixture-of-experts routing, a fixed number of tokens per expert, "
            f"chosen by topk as the zoo's MoE does) [torch: {msg.split('. ')[0]}]")
    if any(k in msg for k in _NEEDS_GPU):  # the model's own code asked for a CUDA device
        return CaptureNotAboutInputs(
            f"capturing {name} failed{at}: the model puts a tensor on a CUDA device itself "
            f"(.cuda(), .to('cuda') or device='cuda'), and the capture runs on meta tensors, "
            f"without a GPU: create it on an input's device (device=x.device) [torch: {msg}]")
    if any(k in msg for k in _CPU_TENSOR):
        return CaptureNotAboutInputs(
            f"capturing {name} failed{at}{' at ' + op if op else ''}: the model makes a tensor on "
            "the CPU itself (torch.ones(...), torch.arange(...) or torch.tensor(...) without "
            "device=), which meets the capture's meta tensors as it would meet CUDA ones on a "
            "GPU, where torch refuses it too: create it on an input's device (device=x.device), "
            "or hold it as a registered buffer, which moves with the model (an input tensor "
            f"inside an object of the model's own is not moved either) [torch: {msg}]")
    hint = ("the optimizer must take the model's parameters and gradients" if "optimizer" in at
            else "inputs must match the model's forward")
    return KitError(f"capturing {name} failed{at}{' at ' + op if op else ''}: {msg} ({hint})")
