"""Recurrent layers as cuDNN runs them on a GPU, not as their CPU decomposition.

On meta tensors nn.LSTM, nn.GRU and nn.RNN (and LSTMCell, GRUCell) decompose into about a dozen
aten ops per time step: two GEMMs, a split and one kernel per gate nonlinearity and product. A
GPU runs them through cuDNN (PyTorch's `_cudnn_rnn`; cells through `_thnn_fused_*_cell`), which
follows Appleyard, Kočiský and Blunsom, "Optimizing Performance of Recurrent Neural Networks on
GPUs" (arXiv:1604.01946, 2016). Per layer and direction, with G gates (4 LSTM, 3 GRU, 1 Elman):

forward   one GEMM of the layer's input by W_ih for all T steps at once (T·B rows), then per
          step one recurrent GEMM h_{t-1}·W_hh^T (B rows) and one fused pointwise kernel that
          adds both GEMMs' gates and the biases, applies the nonlinearities and writes h_t (c_t);
backward  per step the pointwise gradient kernel and the recurrent GEMM for dh_{t-1}, then over
          all T·B rows the GEMMs for dx, dW_ih and dW_hh, and one reduction for the bias grads.
          Frozen weights skip the dW GEMMs and bias sums; a cell (autograd's matmuls, not
          cuDNN) also skips dx and dh where its input or h_{t-1} needs no gradient.

Between stacked layers a training-mode dropout (the module's `dropout`) runs on each layer's
output. Layers and directions are costed one after another: cuDNN can overlap layers in a
wavefront, so a deep stack at small batch comes out as an upper bound. cuDNN's persistent
algorithm (one kernel for the whole recurrence, which torch's cudnn/RNN.cpp get_algo picks for
some single-layer, one-way shapes on some GPUs) is not modelled: its 2·T per-step launches are
counted as the standard algorithm's.
"""
from __future__ import annotations

from dataclasses import dataclass

from kit.errors import KitError
from kit.ops import Dropout, Elementwise, Gemm, dtype_bytes, linear
from kit.workload.kernels import Derived, memory_bound

GATES = {"lstm": 4, "gru": 3, "rnn_tanh": 1, "rnn_relu": 1}
# the activation each step's fused pointwise kernel is costed as
POINTWISE = {"lstm": "sigmoid", "gru": "sigmoid", "rnn_tanh": "tanh", "rnn_relu": "relu"}


@dataclass(frozen=True)
class RnnShape:
    """One recurrent call: `steps` time steps of `batch` sequences through `layers` stacked
    layers (each `directions` = 1 or 2 ways) of `hidden` units, fed `input_size` features."""

    kind: str
    steps: int
    batch: int
    input_size: int
    hidden: int
    layers: int = 1
    directions: int = 1
    biases: bool = True
    dropout: float = 0.0
    dtype: str = "fp32"

    def __post_init__(self):
        if self.kind not in GATES:
            raise KitError(f"unknown recurrent kind {self.kind!r}: choose {', '.join(GATES)}")
        for name in ("steps", "batch", "input_size", "hidden", "layers"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise KitError(f"{self.kind}: {name} must be a whole number >= 1, got {value!r}")
        if self.directions not in (1, 2):
            raise KitError(f"{self.kind}: directions must be 1 or 2, got {self.directions!r}")
        dtype_bytes(self.dtype)

    @property
    def gate_width(self) -> int:
        return GATES[self.kind] * self.hidden

    def layer_inputs(self) -> list[int]:
        """Input features of each layer: the input, then the previous layer's (both ways)."""
        return [self.input_size] + [self.hidden * self.directions] * (self.layers - 1)

    def reserve_elems(self) -> int:
        """Elements cuDNN keeps for backward (its reserve space): each step's gate activations
        and hidden state, plus the cell state for an LSTM, per layer and direction."""
        per_step = self.gate_width + self.hidden * (2 if self.kind == "lstm" else 1)
        return self.layers * self.directions * self.steps * self.batch * per_step


def _per_step(op, steps: int, op_class: str):
    return op if steps == 1 else Derived(op_class, (op,), float(steps), "per time step")


def _dropouts(s: RnnShape, training: bool) -> list:
    if not training or s.dropout <= 0 or s.layers == 1:
        return []
    numel = s.steps * s.batch * s.hidden * s.directions
    return [Dropout(numel, s.dtype, min(s.dropout, 0.99))] * (s.layers - 1)


def forward(s: RnnShape, training: bool = False) -> tuple[Derived, int]:
    """The forward pass as one Derived kernel set, and how many kernels it launches."""
    gw, t, b = s.gate_width, s.steps, s.batch
    recurrent = _per_step(linear(b, s.hidden, gw, s.dtype), t, "gemm")
    step_gates = _per_step(Elementwise(POINTWISE[s.kind], b * gw, s.dtype, inputs=2), t, "elementwise")
    parts = []
    for in_features in s.layer_inputs():
        for _ in range(s.directions):
            parts += [linear(t * b, in_features, gw, s.dtype), recurrent, step_gates]
    drops = _dropouts(s, training)
    kernels = s.layers * s.directions * (1 + 2 * t) + len(drops)
    return Derived("rnn", tuple(parts + drops), 1.0, f"cuDNN {s.kind} forward"), kernels


def backward(s: RnnShape, training: bool = True, dw_ih: bool = True, dw_hh: bool = True,
             dx: bool = True, dh: bool = True, bias_sums: bool = True) -> tuple[Derived, int]:
    """The backward pass (data and weight gradients) as one Derived kernel set, and its
    kernel count. training: whether the forward ran the dropouts between layers. dw_ih, dw_hh:
    whether the dW_ih and dW_hh GEMMs run. cuDNN runs both or neither: _cudnn_rnn_backward
    calls _cudnn_rnn_backward_weight only for output_mask[3], true when any of the flattened
    weights needs a gradient. A cell's two matmuls each run their dW only for their own weight.
    dx, dh: a cell's input and h_{t-1} GEMMs, run by autograd only where those need gradients
    (cuDNN's backward-data pass always writes dx and runs dh every step). bias_sums: whether
    the bias gradients are summed (cuDNN: with the weight gradients; a fused cell's backward:
    whenever it has biases)."""
    gw, t, b, d = s.gate_width, s.steps, s.batch, s.dtype
    parts = []
    for in_features in s.layer_inputs():
        for _ in range(s.directions):
            parts.append(_per_step(Elementwise("mul", b * gw, d, inputs=2), t, "elementwise"))
            if dh:
                parts.append(_per_step(linear(b, gw, s.hidden, d), t, "gemm"))  # dh_{t-1}
            if dx:
                parts.append(linear(t * b, gw, in_features, d))
            for rows, run in ((in_features, dw_ih), (s.hidden, dw_hh)):  # dW_ih, dW_hh
                if run:
                    parts.append(Gemm(m=rows, n=gw, k=t * b, dtype=d, kind="linear", shared_rhs=True))
            if s.biases and bias_sums:  # dgates summed over every step and sequence
                parts.append(memory_bound("reduction", t * b * gw * dtype_bytes(d), d, "bias grads"))
    drops = _dropouts(s, training)  # their backward: one masked multiply each
    parts += [Elementwise("mul", x.numel, d, inputs=2) for x in drops]
    bias = int(s.biases and bias_sums)
    per_layer = t * (1 + int(dh)) + int(dx) + int(dw_ih) + int(dw_hh) + bias
    kernels = s.layers * s.directions * per_layer + len(drops)
    return Derived("rnn", tuple(parts), 1.0, f"cuDNN {s.kind} backward"), kernels
