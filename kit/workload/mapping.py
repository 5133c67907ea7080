"""aten op -> kit op: what each recorded op costs.

`map_op(packet, args, kwargs, out)` returns (kit op or None, op_class, kernels). None marks a
free op (a view, a reshape, an allocation, metadata): it launches no kernel. An op this file does
not know is returned as a memory-bound kernel of class "unknown" moving all its inputs and
outputs once; capture reports it by name. Nothing is dropped.
"""
from __future__ import annotations

import math
from dataclasses import replace

import torch

from kit.ops import (Attention, Dropout, Elementwise, EmbeddingBag, LayerNorm, RMSNorm, Softmax,
                     elementwise_proxy)
from kit.workload.kernels import (ATTENTION_BWD_FLOPS, ATTENTION_BWD_SCALE, Derived, PerBuild, Slowest, copy_of,
                                  embedding_dense_backward, memory_bound)
from kit.workload.mapping_elementwise import (BROADCAST_STREAM_BYTES, OFFSET_COPIES, POW_FAST,  # noqa: F401
                                              _elementwise, _pow_kind, input_streams, mta_launches, nbytes,
                                              unique_nbytes, vectorizable)
from kit.workload.mapping_gemm import GEMM_OPS, flops_gemm, map_gemm
from kit.workload.mapping_vision import VISION_OPS, map_vision

# ops that only change metadata, alias storage or allocate without writing: no kernel
FREE_OPS = {
    "view", "_unsafe_view", "reshape", "t", "transpose", "permute", "expand", "expand_as",
    "squeeze", "unsqueeze", "slice", "select", "as_strided", "alias", "detach", "split",
    "split_with_sizes", "chunk", "unbind", "narrow", "diagonal", "view_as_real", "view_as_complex",
    "empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "lift_fresh",
    "lift_fresh_copy", "_local_scalar_dense", "unfold", "movedim", "numpy_T", "_reshape_alias",
    "sym_size", "sym_stride", "sym_numel", "is_same_size", "_has_compatible_shallow_copy_type",
    "resize_", "set_", "_to_copy_free", "_unsafe_split", "_unsafe_split_with_sizes", "unsqueeze_",
    "squeeze_", "transpose_", "t_", "as_strided_", "_record_function_enter_new",
    "_record_function_exit", "item", "clone_free", "zeros_like_free", "lift", "split_copy_free",
    "_assert_async", "_assert_scalar", "_functional_assert_async", "record_stream",
    "unsafe_split", "unsafe_split_with_sizes", "unsafe_chunk",  # LSTM/GRU gates: views
    "_conj", "_neg_view",  # a lazy conjugate or negation: a bit on the tensor, no kernel
    # a sparse tensor's parts and its wrapping of them (nn.Embedding(sparse=True)'s gradient)
    "_indices", "_values", "indices", "values", "_sparse_coo_tensor_with_dims_and_tensors",
    "_coalesced_", "_nnz",
}

# aten op -> elementwise kind (kit.op_counts.ELEMENTWISE_FLOPS); everything here is one pass over
# its output, reading each full-size input once
ELEMENTWISE = {
    "add": "add", "add_": "add", "sub": "sub", "sub_": "sub", "rsub": "sub", "mul": "mul",
    "mul_": "mul", "div": "div", "div_": "div", "pow": "pow", "pow_": "pow", "neg": "neg",
    "abs": "abs", "relu": "relu", "relu_": "relu", "sigmoid": "sigmoid", "tanh": "tanh",
    "gelu": "gelu", "silu": "silu", "silu_": "silu", "exp": "exp", "log": "log", "sqrt": "sqrt",
    "rsqrt": "rsqrt", "reciprocal": "reciprocal", "clamp": "clamp", "clamp_min": "clamp",
    "clamp_max": "clamp", "hardtanh": "clamp", "where": "where", "maximum": "max", "minimum": "min",
    "max": "max", "min": "min", "erf": "erf", "sin": "sin", "cos": "cos", "square": "square",
    "copy_": "copy", "_to_copy": "cast", "clone": "copy", "contiguous": "copy", "fill_": "fill",
    "zero_": "fill", "zeros": "fill", "ones": "fill", "full": "fill", "zeros_like": "fill",
    "ones_like": "fill", "full_like": "fill", "new_zeros": "fill", "new_ones": "fill",
    "new_full": "fill", "scalar_tensor": "fill", "arange": "fill", "masked_fill": "where",
    "masked_fill_": "where", "lerp": "add", "lerp_": "add", "addcmul": "mul", "addcmul_": "mul",
    "addcdiv": "div", "addcdiv_": "div", "threshold_backward": "where", "gelu_backward": "gelu",
    "silu_backward": "silu", "tanh_backward": "mul", "sigmoid_backward": "mul", "eq": "sub",
    "ne": "sub", "lt": "sub", "le": "sub", "gt": "sub", "ge": "sub", "logical_not": "neg",
    "logical_and": "mul", "logical_or": "add", "bitwise_and": "mul", "bitwise_or": "add",
    "bitwise_not": "neg", "sign": "abs", "floor": "abs", "ceil": "abs", "round": "abs",
    "trunc": "abs", "remainder": "div", "fmod": "div", "floor_divide": "div", "triu": "where",
    "tril": "where", "neg_": "neg", "exp_": "exp", "sqrt_": "sqrt", "rsqrt_": "rsqrt",
    "hardtanh_backward": "where", "log_sigmoid_forward": "sigmoid", "elu": "exp", "leaky_relu": "max",
    "mish": "tanh", "softplus": "exp", "native_dropout_backward": "mul", "cat": "copy",
    "stack": "copy", "repeat": "copy", "repeat_interleave": "copy", "_softmax_backward_data_free": "copy",
    "bernoulli_": "fill", "uniform_": "fill", "normal_": "fill", "randn": "fill", "rand": "fill",
    "randint": "fill", "randn_like": "fill", "rand_like": "fill", "bernoulli": "fill",
    "constant_pad_nd": "copy", "roll": "copy", "flip": "copy", "one_hot": "fill", "type_as": "cast",
    "sgn": "abs", "isnan": "sub", "isinf": "sub", "nan_to_num": "where", "lt_": "sub",
    "mul_Scalar": "mul", "polar": "mul", "view_as_real_copy": "copy",
    # in-place forms (LSTM/GRU cells on meta, Tensor.clamp_, ...) and more activations
    "sigmoid_": "sigmoid", "tanh_": "tanh", "clamp_": "clamp", "clamp_min_": "clamp",
    "clamp_max_": "clamp", "hardtanh_": "clamp", "leaky_relu_": "max", "elu_": "exp",
    "gelu_": "gelu", "logical_and_": "mul", "logical_or_": "add", "hardswish": "clamp",
    "hardswish_": "clamp", "hardsigmoid": "clamp", "hardsigmoid_": "clamp",
    "hardswish_backward": "where", "hardsigmoid_backward": "where", "leaky_relu_backward": "where",
    "elu_backward": "exp", "softplus_backward": "exp", "log_sigmoid_backward": "sigmoid",
    "xlogy": "log",
    # layout shuffles: read every element once, write it once elsewhere
    "pixel_shuffle": "copy", "pixel_unshuffle": "copy", "channel_shuffle": "copy",
    "native_channel_shuffle": "copy", "_pack_padded_sequence": "copy",
    "_pack_padded_sequence_backward": "copy", "_pad_packed_sequence": "copy",
    # padding by reflection or replication: a copy into the larger output; the backward adds
    # the output's gradient into the input's (a copy of the larger gradient, read once)
    **{f"{kind}_pad{d}d{bwd}": "copy" for kind in ("reflection", "replication") for d in (1, 2, 3)
       for bwd in ("", "_backward")},
    # more activations, and the losses' backward passes (one pass over the input's gradient)
    "threshold": "clamp", "threshold_": "clamp", "_prelu_kernel": "max",
    "_prelu_kernel_backward": "where", "celu": "exp", "celu_": "exp", "logit": "log",
    "expm1": "exp", "log1p": "log", "log2": "log", "exp2": "exp", "atan": "tanh", "erfc": "erf",
    "logaddexp": "exp", "mse_loss_backward": "sub", "smooth_l1_loss_backward": "where",
    "huber_loss_backward": "where", "binary_cross_entropy_backward": "div",
    "soft_margin_loss_backward": "exp",
}
REDUCTIONS = {"sum", "mean", "amax", "amin", "argmax", "argmin", "var", "std", "var_mean",
              "std_mean", "norm", "linalg_vector_norm", "prod", "any", "all", "logsumexp",
              "count_nonzero", "max_dim", "min_dim", "cumsum", "cumprod", "nll_loss_forward",
              "nll_loss2d_forward", "_foreach_norm", "aminmax",
              # losses: one pass over the input and target, reduced (or not: reduction="none")
              "mse_loss", "binary_cross_entropy", "binary_cross_entropy_with_logits",
              "smooth_l1_loss", "huber_loss", "soft_margin_loss"}
GATHERS = {"index", "index_select", "gather", "take", "_unsafe_index"}  # out[i] = src[idx[i]]
INDEXING = {"index", "index_select", "gather", "scatter", "scatter_", "scatter_add",
            "scatter_add_", "index_put", "index_put_", "index_add", "index_add_", "index_copy",
            "index_copy_", "masked_scatter", "masked_select", "take", "nll_loss_backward", "nll_loss2d_backward",
            "embedding_dense_backward", "_embedding_bag_backward", "_embedding_bag_dense_backward",
            "topk", "sort", "argsort", "nonzero", "histc", "bincount", "unique", "_unique2",
            "searchsorted", "select_backward", "slice_backward", "index_put_impl_", "_index_put_impl_",
            "new_zeros_scatter", "sparse_coo_tensor",
            # the gathers and scatters of upsampling under torch.use_deterministic_algorithms(True)
            "_unsafe_index", "_unsafe_index_put", "_unsafe_masked_index",
            "_unsafe_masked_index_put_accumulate"}
# scatters costed by the rows they write (their index and source, read, and as much written)
SCATTERS = {"index_put", "index_put_", "_index_put_impl_", "index_add", "index_add_", "scatter",
            "scatter_", "scatter_add", "scatter_add_", "index_copy_"}
SCATTERS_OUT_OF_PLACE = {"index_put", "index_add", "scatter", "scatter_add"}  # + a copy of self
ATTENTION_FWD = {"_scaled_dot_product_efficient_attention", "_scaled_dot_product_flash_attention",
                 "_scaled_dot_product_flash_attention_for_cpu", "_scaled_dot_product_cudnn_attention",
                 "_flash_attention_forward", "_efficient_attention_forward",
                 "scaled_dot_product_attention", "_scaled_dot_product_attention_math",
                 "_scaled_dot_product_fused_attention_overrideable"}
ATTENTION_BWD = {name + "_backward" for name in ATTENTION_FWD} | {
    "_flash_attention_backward", "_efficient_attention_backward"}

_FLOAT_DTYPES = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16",
                 torch.float64: "fp32"}


def kit_dtype(t: torch.Tensor) -> tuple[str, float]:
    """(kit dtype, element-count multiplier) that move the same bytes as tensor t's dtype."""
    d = t.dtype
    if d.is_complex:  # a real and an imaginary part, each of the real dtype
        real, mult = kit_dtype(torch.empty(0, dtype=d.to_real()))
        return real, 2 * mult
    if d in _FLOAT_DTYPES:
        return _FLOAT_DTYPES[d], (2.0 if d == torch.float64 else 1.0)
    size = t.element_size()
    if size == 8:
        return "fp32", 2.0
    if size == 4:
        return "fp32", 1.0
    if size == 2:
        return "fp16", 1.0
    return ("fp8", 1.0) if "float8" in str(d) or size == 1 else ("fp32", size / 4)


def tensors(obj) -> list[torch.Tensor]:
    """Every tensor in a nest of lists/tuples/dicts, in order."""
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, (list, tuple)):
        return [t for o in obj for t in tensors(o)]
    if isinstance(obj, dict):
        return [t for o in obj.values() for t in tensors(o)]
    return []


def _dense(ts: list) -> list:
    """The tensors a kernel moves: a sparse COO tensor as its indices and values (nnz rows, not
    its dense size)."""
    return [p for t in ts for p in ((t._indices(), t._values()) if t.is_sparse else (t,))]


def _rows_cols(x: torch.Tensor, norm_dims: int = 1) -> tuple[int, int]:
    cols = math.prod(x.shape[-norm_dims:]) if x.dim() else 1
    return max(1, x.numel() // max(cols, 1)), max(cols, 1)


def _attention(q, k, v, dtype: str, causal: bool, mask=None) -> Attention:
    """q/k: (b, heads or kv_heads, seq, d), v: (b, kv_heads, seq_kv, dv) (any leading batch dims).
    The values' head size dv may differ from d (DeepSeek's multi-head latent attention). mask:
    the attn_mask or bias tensor, read as its own elements (a broadcast dim counted once)."""
    b = math.prod(q.shape[:-3]) if q.dim() > 3 else 1
    heads, seq_q, d = q.shape[-3] if q.dim() > 2 else 1, q.shape[-2], q.shape[-1]
    kv_heads, seq_kv, dv = k.shape[-3] if k.dim() > 2 else 1, k.shape[-2], v.shape[-1]
    return Attention(b=b, heads=heads, seq_q=seq_q, seq_kv=seq_kv, head_dim=d, dtype=dtype,
                     causal=bool(causal), kv_heads=kv_heads if kv_heads != heads else None,
                     v_head_dim=dv if dv != d else None,
                     mask_bytes=unique_nbytes(mask) if isinstance(mask, torch.Tensor) else 0)


# where an attention op takes its mask (an additive bias, or a boolean mask): by name (the
# recorder names every argument of an attention op), else by position
_MASK_NAMES = ("attn_bias", "attn_mask", "bias")
_MASK_POSITION = {"_scaled_dot_product_efficient_attention": 3, "_scaled_dot_product_cudnn_attention": 3,
                  "_efficient_attention_forward": 3, "scaled_dot_product_attention": 3,
                  "_scaled_dot_product_attention_math": 3,
                  "_scaled_dot_product_fused_attention_overrideable": 3,
                  "_scaled_dot_product_efficient_attention_backward": 4,
                  "_efficient_attention_backward": 4}


def _mask_arg(packet: str, args, kwargs):
    """The mask tensor an attention op reads, or None."""
    for name in _MASK_NAMES:
        if isinstance(kwargs.get(name), torch.Tensor):
            return kwargs[name]
    pos = _MASK_POSITION.get(packet)
    if pos is not None and len(args) > pos and isinstance(args[pos], torch.Tensor):
        return args[pos]
    return None


def _causal_arg(packet: str, args, kwargs) -> bool:
    if "is_causal" in kwargs:
        return bool(kwargs["is_causal"])
    # positional is_causal: efficient (q,k,v,bias,lse,dropout,causal); flash (q,k,v,dropout,causal)
    pos = {"_scaled_dot_product_efficient_attention": 6, "_scaled_dot_product_flash_attention": 4,
           "_scaled_dot_product_flash_attention_for_cpu": 4,
           "_scaled_dot_product_cudnn_attention": 6}.get(packet)
    if pos is not None and len(args) > pos and isinstance(args[pos], bool):
        return args[pos]
    return False


def _foreach(packet: str, args, out, build: str = "cuda13") -> tuple[Elementwise, int]:
    lists = [a for a in args if isinstance(a, (list, tuple)) and a and isinstance(a[0], torch.Tensor)]
    first = lists[0] if lists else tensors(args)
    numel = sum(t.numel() for t in first) or 1
    dtype, mult = kit_dtype(first[0])
    reads = len(lists) if lists else 1
    return Elementwise("add", max(1, int(numel * mult)), dtype, inputs=reads), \
        _foreach_launches(packet, lists or [first], args, out, build)


def _launched(cls: str, op: Elementwise, launches: int, packet: str):
    """A foreach op (or fused AdamW: 7 streams to the 5 of `op`'s pass) of `launches` kernels."""
    if cls == "optimizer":
        return Derived("optimizer", (_one_launch(op, launches),), 7 / 5 * launches, packet)
    if launches > 1:
        return Derived(cls, (_one_launch(op, launches),), launches, packet)
    return op


def _one_launch(op: Elementwise, launches: int) -> Elementwise:
    """One of a _foreach_* op's `launches` kernels, its share of the elements: the node is priced
    as launches x this, each launch carrying (and in the stream shedding) its own dispatch floor.
    Priced as one kernel of all the elements, the op's isolated time had held one floor where
    kit.workload.kernel_times.in_stream_ms then shed one a kernel: llama3-8b's 55-launch
    _foreach_mul_ on an H100 (8.03 B bf16 elements, 12.86 ms isolated, 12.74 us floor) had lost
    55 floors, 0.70 ms, to 12.16 ms; 55 launches of 146 M elements each shed their own, to 12.64
    ms (in_stream_ms now sheds the floors a node's predictions hold, whatever its kernels)."""
    return replace(op, numel=max(1, -(-op.numel // launches)))


def _foreach_launches(packet: str, lists: list, args, out, build: str = "cuda13") -> int:
    """The kernels a _foreach_* op or fused optimizer launches (mta_launches): its depth is the
    lists of the first's sizes it walks (a fused AdamW's parameters, gradients and two moments,
    not its one-element step counts), and an out-of-place op's output list (_foreach_sqrt's); a
    _foreach_* op with a scalar a tensor (a list, or a 1-d tensor of them: AdamW's step sizes)
    takes fewer tensors a launch."""
    sizes = [t.numel() for t in lists[0]]
    depth = sum(1 for a in lists if len(a) == len(sizes) and [t.numel() for t in a] == sizes)
    outs = out if isinstance(out, (list, tuple)) else []
    depth += bool(outs) and [t.numel() for t in tensors(outs)] == sizes
    def scalar_per_tensor(a) -> bool:
        if isinstance(a, torch.Tensor):
            return a.dim() == 1 and len(sizes) > 1 and a.numel() == len(sizes)
        return isinstance(a, (list, tuple)) and bool(a) and not isinstance(a[0], torch.Tensor)

    scalars = packet.startswith("_foreach_") and any(scalar_per_tensor(a) for a in args[1:])
    return max(1, mta_launches(sizes, depth, scalars, build))


def map_op(packet: str, args, kwargs, out, copies_self: bool = True) -> tuple[object | None, str, int]:
    """(kit op or None, op_class, kernels) for one aten op; packet is the aten name ("mm").
    copies_self: an out-of-place scatter (SCATTERS_OUT_OF_PLACE) copies its self first, as CUDA
    runs it; False where it stands for the in-place kernel CUDA runs (autograd's gradient of a
    gather or an index, which a dispatch mode sends to the out-of-place form: the recorder's
    Recorder._copies_self)."""
    kwargs = kwargs or {}
    if packet in FREE_OPS:
        return None, "free", 0
    ins = _dense(tensors(args) + tensors(kwargs))
    outs = _dense(tensors(out))
    lead = (outs or ins or [None])[0]
    if lead is None:
        return None, "free", 0
    dtype, mult = kit_dtype(ins[0] if ins and ins[0].is_floating_point() else lead)
    if packet in GEMM_OPS:
        return map_gemm(packet, args, kwargs, dtype)
    if packet in ATTENTION_FWD:
        return _attention(args[0], args[1], args[2], dtype, _causal_arg(packet, args, kwargs),
                          _mask_arg(packet, args, kwargs)), "attention", 1
    if packet in ATTENTION_BWD:
        q, k, v = args[1], args[2], args[3]
        fwd = _attention(q, k, v, dtype, _causal_arg(packet.removesuffix("_backward"), args[1:], kwargs),
                         _mask_arg(packet, args, kwargs))
        return (Derived("attention", (fwd,), ATTENTION_BWD_SCALE, "attention backward", ATTENTION_BWD_FLOPS),
                "attention", 1)
    if packet in ("_softmax", "_safe_softmax", "_log_softmax", "softmax"):
        rows, cols = _rows_cols(args[0])
        return Softmax(rows, cols, dtype), "softmax", 1
    if packet in ("_softmax_backward_data", "_log_softmax_backward_data"):
        # reads y and dy, writes dx
        return memory_bound("softmax", 3 * nbytes(args[0]), dtype, label=packet), "softmax", 1
    if packet in ("native_layer_norm", "layer_norm"):
        nd = len(args[1]) if len(args) > 1 and isinstance(args[1], (list, tuple)) else 1
        return LayerNorm(*_rows_cols(args[0], nd), dtype), "layernorm", 1
    if packet == "native_layer_norm_backward":
        # dx kernel: reads x, dy, writes dx; dgamma/dbeta kernel: reads x, dy again
        n = nbytes(args[1])
        return memory_bound("layernorm", 5 * n, dtype, label=packet), "layernorm", 2
    if packet in ("_fused_rms_norm", "rms_norm"):
        nd = len(args[1]) if len(args) > 1 and isinstance(args[1], (list, tuple)) else 1
        return RMSNorm(*_rows_cols(args[0], nd), dtype), "rmsnorm", 1
    if packet == "_fused_rms_norm_backward":
        return memory_bound("rmsnorm", 4 * nbytes(args[0]), dtype, label=packet), "rmsnorm", 2
    if packet == "native_dropout":
        return _dropout(args, dtype, mult), "dropout", 1
    if packet == "embedding":
        weight, idx = args[0], args[1]
        return EmbeddingBag(batch=max(1, idx.numel()), rows=weight.shape[0], dim=weight.shape[1],
                            pooling=1, dtype=dtype), "embedding", 1
    if packet in ("_embedding_bag", "_embedding_bag_forward_only", "embedding_bag"):
        weight, idx, offsets = args[0], args[1], args[2]
        bags = max(1, offsets.numel())
        return EmbeddingBag(batch=bags, rows=weight.shape[0], dim=weight.shape[1],
                            pooling=max(1, round(idx.numel() / bags)), dtype=dtype), "embedding", 1
    if packet == "embedding_dense_backward":
        grad, num_weights = args[0], int(args[2])
        # zero the (num_weights, dim) gradient, then scatter-add every row of grad into it
        return embedding_dense_backward(num_weights, grad.shape[-1], grad.element_size(), nbytes(grad),
                                        dtype), "embedding", 2
    if packet in ("_embedding_bag_backward", "_embedding_bag_dense_backward") and outs:
        # like embedding_dense_backward: zero the (num_weights, dim) gradient once, then add each
        # bag's gradient row into the row of every index in the bag (read it, read-modify-write
        # the row); plus the index, offset and bag-size reads
        grad, idx = args[0], args[1]
        row = grad.shape[-1] * grad.element_size()
        ints = sum(nbytes(t) for t in ins if not t.is_floating_point())
        return memory_bound("embedding", nbytes(outs[0]) + 2 * idx.numel() * row + ints, dtype,
                            label=packet), "embedding", 2
    if packet in ("slice_backward", "select_backward", "nll_loss_backward") and outs:
        # zero the input-sized gradient, then copy grad into its slice (or, for the NLL loss,
        # write -grad/n at each row's target): write it, read and write grad, read the targets
        ints = sum(nbytes(t) for t in ins if not t.is_floating_point())
        return memory_bound("indexing", nbytes(outs[0]) + 2 * nbytes(args[0]) + ints, dtype,
                            label=packet), "indexing", 2
    if packet in VISION_OPS:  # convolutions, batch/group norm, pooling, upsampling, im2col
        return map_vision(packet, args, ins, outs, dtype)
    if packet.startswith("_foreach_") or packet.startswith("_fused_adam") or packet == "_fused_sgd_":
        op, kernels = _foreach(packet, args, out)
        legacy = _foreach(packet, args, out, "legacy")[1]  # a CUDA 12 or ROCm build's launches
        cls = "optimizer" if packet.startswith("_fused_adam") else \
            "reduction" if packet == "_foreach_norm" else "elementwise"
        if cls == "optimizer":  # param, grad, m, v read; param, m, v written
            op = Elementwise("add", op.numel, op.dtype, inputs=4)
        mine = _launched(cls, op, kernels, packet)
        if legacy == kernels:
            return mine, cls, kernels
        # the two tables launch different counts: both kept, the GPU's taken (kernels.PerBuild)
        base = mine if isinstance(mine, Derived) else Derived(cls, (op,), 1.0, packet)
        return PerBuild(base.op_class, base.parts, base.scale, packet, legacy_op=_launched(cls, op, legacy, packet),
                        legacy_kernels=legacy), cls, kernels
    if packet in REDUCTIONS or (packet in ("max", "min") and len(ins) == 1):
        # aten.max.dim / max (one tensor: a reduction, values and indices) reach here as "max",
        # like the elementwise max.other of two tensors
        moved = sum(nbytes(t) for t in ins) + sum(nbytes(t) for t in outs)
        return memory_bound("reduction", moved, dtype, label=packet), "reduction", 1
    if packet in GATHERS and outs:
        # a gather reads the rows it selects, not its whole source (an expert's tokens out of
        # the batch, the experts' weights a decode step picks): the output's bytes, read and
        # written, and the indices
        idx = sum(nbytes(t) for t in ins if not t.is_floating_point() and not t.is_complex())
        return memory_bound("indexing", 2 * sum(nbytes(t) for t in outs) + idx, dtype,
                            label=packet), "indexing", 1
    if packet in ("index_fill", "index_fill_"):  # (self, dim, index, value): the named slices
        target, index = args[0], args[2]
        per_slice = target.numel() // max(target.shape[int(args[1])], 1) if target.dim() else 1
        moved = index.numel() * per_slice * target.element_size() + nbytes(index)
        copy = 2 * nbytes(target) if packet == "index_fill" else 0  # out of place: self copied
        return memory_bound("indexing", moved + copy, dtype, label=packet), "indexing", 1 + bool(copy)
    if packet.startswith(("grid_sampler", "cudnn_grid_sampler")) and outs:
        return _grid_sampler(packet, args, outs, dtype), "indexing", 1
    if packet in INDEXING:
        moved = sum(nbytes(t) for t in ins) + 2 * sum(nbytes(t) for t in outs)
        copies = False
        if packet in SCATTERS:
            # in-place scatters touch only the rows they write, not the whole destination
            moved = sum(nbytes(t) for t in ins[1:]) * 2 or moved
            # an out-of-place one (x.scatter(...) in a forward) first copies self into its
            # output, as CUDA runs it (clone, then the in-place kernel); not where it stands for
            # an in-place kernel CUDA runs on fresh zeros (copies_self False: the capture's
            # dispatch mode makes autograd take index_put for index's gradient, scatter_add for
            # gather's, index_add for index_select's)
            copies = copies_self and packet in SCATTERS_OUT_OF_PLACE and bool(ins)
            if copies:
                moved += 2 * nbytes(ins[0])
        return memory_bound("indexing", moved, dtype, label=packet), "indexing", 1 + copies
    if packet == "glu":  # reads both halves of x, writes their gated product
        return Elementwise("sigmoid", max(1, int(lead.numel() * mult)), dtype, inputs=2), "elementwise", 1
    if packet == "glu_backward":  # reads dy (half of x's size) and x, writes dx
        n = max(1, int(args[1].numel() * mult))
        return Derived("elementwise", (Elementwise("mul", n, dtype, inputs=2),), 2.5 / 3,
                       "glu backward"), "elementwise", 1
    if packet in ELEMENTWISE:
        # an elementwise pass is one sweep over its output: it is sized in the output's dtype,
        # and each input weighs its own element size against it (input_streams): a cast
        # fp32 -> bf16 reads 4 and writes 2 bytes an element, a comparison writes 1-byte bools
        odtype, omult = kit_dtype(lead)
        if packet == "copy_" and len(args) > 1 and isinstance(args[1], torch.Tensor):
            ins = [args[1]]  # copy_ reads its source and writes self (not a cat of the two)
        elif packet in ("masked_fill", "masked_fill_"):
            # a value tensor is read on the host (value.item()) and passed to the kernel by value
            ins = [t for t in ins if t.dim() > 0]
        kind = _pow_kind(args) if ELEMENTWISE[packet] == "pow" else ELEMENTWISE[packet]
        return _elementwise(kind, ins, outs, lead, odtype, omult, cpu_scalars=packet != "where",
                            generic=packet in OFFSET_COPIES), "elementwise", 1
    moved = max(sum(nbytes(t) for t in ins) + sum(nbytes(t) for t in outs), 1)
    flops = _registry_flops(packet, args, kwargs, out)
    if flops > 0:  # never under its bytes' stream nor its FLOPs at the GPU's peak: the slower
        return Slowest("unknown", (copy_of(moved, dtype), flops_gemm(flops, dtype)), packet), "unknown", 1
    return memory_bound("unknown", moved, dtype, label=packet), "unknown", 1


def _registry_flops(packet: str, args, kwargs, out) -> float:
    """The FLOPs torch.utils.flop_counter counts for an op it knows (its flop_registry: GEMMs,
    convolutions, attention, _scaled_mm), 0 for the rest."""
    from torch.utils.flop_counter import flop_registry

    formula = flop_registry.get(getattr(torch.ops.aten, packet, None))
    if formula is None:
        return 0.0
    try:
        return float(formula(*args, **kwargs, out_val=out))
    except Exception:  # a formula for another overload's arguments: no count
        return 0.0


def _grid_sampler(packet: str, args, outs, dtype: str) -> Derived:
    """F.grid_sample: each output element reads the input at its 4 (2-D) or 8 (3-D) corners and
    its grid point; the backward zeroes the input's gradient, adds each gradient element into its
    corners (a read and a write each) and reads the input's corners for the grid's gradient."""
    corners = 8 if "3d" in packet else 4
    if "backward" not in packet:
        moved = (corners + 1) * nbytes(outs[0]) + nbytes(args[1])
    else:  # (grad, input, grid, ...) -> (grad input, grad grid)
        moved = nbytes(outs[0]) + 3 * corners * nbytes(args[0]) + 2 * nbytes(args[2])
    return memory_bound("indexing", moved, dtype, label=packet)


def _dropout(args, dtype: str, mult: float) -> Derived:
    """CUDA's fused dropout kernel, costed as kit.ops.elementwise_proxy says (the learned
    one-input pass, scaled by the bytes dropout moves), as `kit op dropout` costs it."""
    p = float(args[1]) if len(args) > 1 else 0.5
    drop = Dropout(max(1, int(args[0].numel() * mult)), dtype, min(max(p, 0.0), 0.99))
    base, scale = elementwise_proxy(drop)
    return Derived("dropout", (base,), scale, "dropout (y and a bool mask)")


__all__ = ["map_op", "kit_dtype", "tensors", "nbytes", "copy_of", "vectorizable", "input_streams", "POW_FAST",
           "BROADCAST_STREAM_BYTES"]
