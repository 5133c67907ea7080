"""The small per-token kernels of Megatron's vocab-parallel embedding and cross entropy
(megatron-core 0.16.1, tensor_parallel/layers.py and tensor_parallel/cross_entropy.py), which
kit.parallel.gpt's embedding and head blocks run beside their big [tokens, hidden] and
[tokens, vocab/tp] passes.

Each is one CUDA kernel over tokens elements (token ids and targets are int64, a boolean mask a
byte, the logits fp32), costed as a memory-bound kernel of the bytes it reads and writes: small,
so on the GPU each is what the stream gives a kernel, its roofline plus a kernel's start, and on
the host an eager op's launch (TokenKernel), not the predictor's isolated floor and the fitted
launch. A boolean-mask store of a Python scalar, `t[mask] = 0`, is one masked_fill_ kernel, not
nonzero + index_put: torch's
_index_put_impl_ dispatches to masked_fill_ where the one index is a boolean mask and the value a
one-element CPU tensor (canDispatchToMaskedFill, aten/src/ATen/native/TensorAdvancedIndexing.cpp),
and Python's __setitem__ puts a scalar value for a CUDA tensor on the CPU
(torch/csrc/autograd/python_variable_indexing.cpp); its .item() reads host memory, so no sync.
(torch 2.13's profiler on the CPU shows index_put_ -> _index_put_impl_ -> masked_fill_.)
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from kit import ops

INDEX_BYTES = 8  # int64 token ids, targets and aranges
MASK_BYTES = 1  # torch.bool


@dataclass(frozen=True)
class TokenKernel(ops.Elementwise):
    """A kernel of the ids' bookkeeping, costed as the copy of its bytes. Integer and mask
    tensors carry no gradient: it has no backward (kit.parallel.gpt.embedding_backward).

    Priced in the stream (kit.parallel.costs.Coster.op_ms): its roofline plus a kernel's start,
    2 us (kit.workload.kernel_times.KERNEL_MIN_US), not the predictor's isolated time, whose
    ~25 us dispatch floor the analytic layer's other kernels keep as a calibration for work it
    does not list, this among it; its launch, counted apart on the host, an eager op's
    (Coster.stream_op_host_ms), not the launch_us a profile fitted per listed kernel."""

    label: str = ""
    priced_in_stream = True  # a class attribute, not a field: no part of the op's identity


@dataclass(frozen=True)
class OutputMask(ops.Elementwise):
    """VocabParallelEmbedding's output_parallel[input_mask, :] = 0.0 (layers.py line 290): a
    masked_fill_ over [tokens, hidden] that reads the rows and the broadcast mask and writes the
    rows. Its backward (autograd's IndexPutBackward0: grad.index_put(indices, zeros_like(value)))
    clones the gradient and masked-fills the clone: backward_kernels."""

    mask_bytes: int = 0

    @property
    def bytes(self) -> float:
        return float(2 * ops.dtype_bytes(self.dtype) * self.numel + self.mask_bytes)

    def backward_kernels(self) -> list:
        copy = ops.Elementwise("copy", self.numel, self.dtype)  # the clone: read and write
        return [copy, self]


def _kernel(nbytes: int, label: str) -> TokenKernel:
    return TokenKernel("copy", max(1, math.ceil(nbytes / 8)), "fp32", label=label)


def id_mask_kernels(tokens: int) -> list[TokenKernel]:
    """mask = (ids < start) | (ids >= end); masked = ids.clone() - start; masked[mask] = 0
    (layers.py lines 276-279 for the embedding's input, cross_entropy.py lines 48-50 for the
    targets): lt and ge (read 8, write 1 a token), bitwise_or (read 2, write 1), clone and sub
    (read 8, write 8), masked_fill_ (read 8 and the mask's 1, write 8). Six kernels."""
    i, m = INDEX_BYTES, MASK_BYTES
    return [_kernel(tokens * (i + m), "ids < start"), _kernel(tokens * (i + m), "ids >= end"),
            _kernel(tokens * 3 * m, "mask or"), _kernel(tokens * 2 * i, "ids clone"),
            _kernel(tokens * 2 * i, "ids - start"), _kernel(tokens * (2 * i + m), "ids[mask] = 0")]


def embedding_output_mask(tokens: int, hidden: int, dtype: str) -> OutputMask:
    return OutputMask("copy", tokens * hidden, dtype, mask_bytes=tokens * MASK_BYTES)


def cross_entropy_forward_kernels(tokens: int) -> list[TokenKernel]:
    """cross_entropy.py lines 48-62: the target mask (id_mask_kernels), arange (write 8 a token),
    logits_2d[arange, masked_target] (one index kernel: read both indices, 16, and a logit, 4;
    write 4), .clone() (read 4, write 4), predicted_logits[target_mask] = 0.0 (masked_fill_:
    read 4 and 1, write 4). Ten kernels, before the exp."""
    i, m = INDEX_BYTES, MASK_BYTES
    return [*id_mask_kernels(tokens), _kernel(tokens * i, "arange"),
            _kernel(tokens * (2 * i + 4 + 4), "logits[arange, target]"),
            _kernel(tokens * 8, "predicted clone"), _kernel(tokens * (4 + m + 4), "predicted[mask] = 0")]


def cross_entropy_loss_kernels(tokens: int) -> list[TokenKernel]:
    """cross_entropy.py line 77: loss = torch.log(sum_exp_logits) - predicted_logits, two kernels
    (log: read 4, write 4; sub: read 8, write 4)."""
    return [_kernel(tokens * 8, "log(sum)"), _kernel(tokens * 12, "log(sum) - predicted")]


def cross_entropy_backward_kernels(tokens: int) -> list[TokenKernel]:
    """cross_entropy.py lines 97-99 and 114: arange (write 8), target_mask.float() (read 1,
    write 4), 1.0 - it (read 4, write 4), then grad_2d[arange, masked_target] -= softmax_update
    as Python runs it: an index kernel (read 16 of indices and 4, write 4), the in-place sub
    (read 8, write 4) and index_put_ of the result (read 16 of indices and 4, write 4). Six
    kernels, before the scale by the loss gradient."""
    i, m = INDEX_BYTES, MASK_BYTES
    return [_kernel(tokens * i, "arange"), _kernel(tokens * (m + 4), "mask.float()"),
            _kernel(tokens * 8, "1 - mask"), _kernel(tokens * (2 * i + 8), "grad[arange, target]"),
            _kernel(tokens * 12, "-= update"), _kernel(tokens * (2 * i + 8), "grad[arange, target] =")]


def loss_transpose_kernels(tokens: int, micro_batch: int) -> tuple[list, list]:
    """megatron-core 0.16.1 LanguageModule.compute_language_model_loss (language_module.py lines
    139 and 170): labels.transpose(0, 1).contiguous() ([b, s] int64 to [s, b]: read 8, write 8
    a token) before the cross entropy and loss.transpose(0, 1).contiguous() (fp32: read 4,
    write 4) after it. At micro-batch 1 the transposed tensor is already contiguous (a size-1
    dimension's stride does not count) and .contiguous() launches nothing. Their backward is a
    view: the cross entropy's grad_input.mul_ (cross_entropy.py line 117) takes the transposed
    gradient as it is. Returns (before, after) the cross entropy."""
    if micro_batch == 1:
        return [], []
    return [_kernel(tokens * 2 * INDEX_BYTES, "labels [b, s] -> [s, b]")], \
        [_kernel(tokens * 8, "loss [s, b] -> [b, s]")]
