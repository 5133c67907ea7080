"""Capture glue for kit.workload.rnn: a recurrent call becomes one node per pass.

capture's TorchFunctionMode hands every torch._VF recurrent call here (`fused`). The call runs
on meta tensors with the recorder muted (its CPU decomposition is not what a GPU runs), and the
recorder gets one "cudnn.<kind>" node instead, costed by kit.workload.rnn. In training an
autograd Function gives the backward pass one "cudnn.<kind>_backward" node the same way, and
saves a meta tensor the size of cuDNN's reserve space, so the activation memory counts it.

Packed sequences and LSTMs with a projection (proj_size) keep their decomposition.
"""
from __future__ import annotations

import warnings

import torch

from kit.workload.mapping import kit_dtype
from kit.workload.rnn import GATES, RnnShape, backward, forward

SEQUENCE = {torch._VF.lstm: "lstm", torch._VF.gru: "gru", torch._VF.rnn_tanh: "rnn_tanh",
            torch._VF.rnn_relu: "rnn_relu"}
CELLS = {torch._VF.lstm_cell: "lstm", torch._VF.gru_cell: "gru"}


def _sequence_shape(kind: str, args) -> RnnShape | None:
    """The shape of a torch._VF.<kind>(input, hx, params, has_biases, num_layers, dropout, train,
    bidirectional, batch_first) call; None for the packed-sequence form or a projection."""
    if len(args) < 9 or not isinstance(args[2], (list, tuple)):
        return None  # (data, batch_sizes, hx, params, ...): a PackedSequence
    x, _hx, params, biases, layers, dropout, _train, bidirectional, batch_first = args[:9]
    dirs = 2 if bidirectional else 1
    if x.dim() != 3 or len(params) != layers * dirs * (4 if biases else 2):
        return None
    steps, batch = (x.shape[1], x.shape[0]) if batch_first else (x.shape[0], x.shape[1])
    return RnnShape(kind, int(steps), int(batch), int(params[0].shape[1]), int(params[1].shape[1]),
                    int(layers), dirs, bool(biases), float(dropout), kit_dtype(x)[0])


def _cell_shape(kind: str, args) -> RnnShape | None:
    """(input, hx, w_ih, w_hh[, b_ih, b_hh]) of one cell step."""
    x, w_hh = args[0], args[3]
    if x.dim() != 2 or w_hh.shape[0] != GATES[kind] * w_hh.shape[1]:
        return None
    biases = len(args) > 4 and args[4] is not None
    return RnnShape(kind, 1, int(x.shape[0]), int(x.shape[1]), int(w_hh.shape[1]), biases=biases,
                    dtype=kit_dtype(x)[0])


def shape_of(func, args) -> RnnShape | None:
    if func in SEQUENCE:
        return _sequence_shape(SEQUENCE[func], args)
    if func in CELLS:
        return _cell_shape(CELLS[func], args)
    return None


def _flatten(args):
    """The tensors of a call's arguments, the argument each came from, and a function that puts
    new ones back in place."""
    flat, owners, slots = [], [], []
    for i, a in enumerate(args):
        if isinstance(a, torch.Tensor):
            slots.append((i, None))
            flat.append(a)
            owners.append(i)
        elif isinstance(a, (list, tuple)) and a and all(isinstance(t, torch.Tensor) for t in a):
            slots.append((i, len(a)))
            flat.extend(a)
            owners += [i] * len(a)

    def rebuild(tensors):
        out, it = list(args), iter(tensors)
        for i, n in slots:
            out[i] = next(it) if n is None else type(args[i])(next(it) for _ in range(n))
        return out

    return flat, owners, rebuild


class _Fused(torch.autograd.Function):
    @staticmethod
    def forward(ctx, rec, func, shape, training, owners, rebuild, *flat):
        with rec.muted():
            out = func(*rebuild(flat))
            reserve = torch.empty(shape.reserve_elems(), dtype=flat[0].dtype, device="meta")
        outs = out if isinstance(out, tuple) else (out,)
        op, kernels = forward(shape, training)
        rec.record_fused(f"cudnn.{shape.kind}", op, "rnn", kernels, list(flat), list(outs))
        ctx.rec, ctx.shape, ctx.path = rec, shape, rec.stack[-1]
        ctx.training, ctx.owners, ctx.cell = training, owners, func in CELLS
        ctx.metas = [(t.shape, t.dtype) for t in flat]
        ctx.save_for_backward(reserve)
        return out

    @staticmethod
    def backward(ctx, *grads):
        rec, needs = ctx.rec, ctx.needs_input_grad[6:]
        with rec.muted():
            outs = [torch.empty(s, dtype=d, device="meta") if need else None
                    for (s, d), need in zip(ctx.metas, needs)]
        (reserve,) = ctx.saved_tensors
        if not ctx.cell and not ctx.training:
            # cuDNN's backward-data pass checks its train flag: nn.LSTM.eval() then .backward()
            # on a GPU raises "cudnn RNN backward can only be called in training mode". The note
            # names the module: a model with two eval-mode LSTMs, each called over 3 steps, had
            # one note for its 6 calls (Python shows a text once) saying only "cudnn.lstm"
            where = f"{ctx.path} (cudnn.{ctx.shape.kind})" if ctx.path else f"cudnn.{ctx.shape.kind}"
            warnings.warn(f"{where}: a backward through a recurrent layer in eval mode, "
                          "which cuDNN refuses on a GPU (\"cudnn RNN backward can only be called in "
                          "training mode\"): priced as cuDNN's backward without dropout, as with the "
                          "layer in train mode and dropout 0", stacklevel=2)
        op, kernels = backward(ctx.shape, ctx.training, **_grads_run(ctx.owners, needs, ctx.cell))
        rec.record_fused(f"cudnn.{ctx.shape.kind}_backward", op, "rnn", kernels,
                         [g for g in grads if g is not None] + [reserve],
                         [o for o in outs if o is not None], ctx.path)
        return (None, None, None, None, None, None, *outs)


def _grads_run(owners, needs, cell: bool) -> dict:
    """Which of backward's GEMMs run, from which arguments need gradients: the weights are
    arguments 2 on (params, or a cell's w_ih, w_hh, b_ih, b_hh), the input 0 and h_{t-1} the
    first tensor of argument 1. A frozen LSTM under a trained embedding, batch 4, 6 steps, 8 in,
    16 hidden, had been given its 2 dW GEMMs and bias sum anyway: 147456 backward GEMM FLOPs for
    the 73728 of dx and dh alone. A cell's dW_ih and dW_hh follow w_ih and w_hh alone (its
    biases' gradients are the fused kernel's sums): an LSTMCell loop (4 x 24 -> 32, 5 steps)
    with frozen weights and trained biases had kept both dW GEMMs, 704512 FLOPs where torch's
    FlopCounterMode counts 417792."""
    def needed(arg: int) -> bool:
        return any(need for need, owner in zip(needs, owners) if owner == arg)

    if not cell:
        weights = any(need for need, owner in zip(needs, owners) if owner >= 2)
        return {"dw_ih": weights, "dw_hh": weights, "bias_sums": weights}
    # h_{t-1} is argument 1's first tensor (an LSTM cell's c_{t-1} needs no GEMM)
    dh = 1 in owners and bool(needs[owners.index(1)])
    return {"dw_ih": needed(2), "dw_hh": needed(3), "dx": needed(0), "dh": dh}


def fused(rec, func, args, kwargs):
    """Run a recurrent torch._VF call as cuDNN would: one recorded node per pass. Returns
    NotImplemented when the call keeps its decomposition (packed, projected, keyword args)."""
    shape = shape_of(func, args) if not kwargs else None
    if shape is None:
        return NotImplemented
    training = func in SEQUENCE and bool(args[6])  # the call's own train flag (its dropout)
    flat, owners, rebuild = _flatten(args)
    return _Fused.apply(rec, func, shape, training, owners, rebuild, *flat)
