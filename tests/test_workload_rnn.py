"""Recurrent layers are captured as cuDNN runs them (kit.workload.rnn): one node per pass, with
the kernel count and GEMM work of cuDNN's schedule, checked against hand counts."""
import pytest
import torch
import torch.nn as nn

from kit.errors import KitError
from kit.workload.capture import capture
from kit.workload.kernels import leaf_ops
from kit.workload.rnn import RnnShape, backward, forward

torch.set_num_threads(1)


def _rnn_nodes(graph):
    return [n for n in graph.kernels() if n.op_class == "rnn"]


def _gemm_flops(op) -> float:
    return sum(p.flops * s for p, s in leaf_ops(op) if p.op_class == "gemm")


def _forward_gemm_flops(steps, batch, inputs, hidden, gates, dirs):
    """Per layer and direction: x_t W_ih^T and h_{t-1} W_hh^T for every step."""
    return sum(dirs * 2 * steps * batch * (i + hidden) * gates * hidden for i in inputs)


@pytest.mark.parametrize("cls,gates", [(nn.LSTM, 4), (nn.GRU, 3), (nn.RNN, 1)])
@pytest.mark.parametrize("bidirectional", [False, True])
def test_inference_is_one_cudnn_node_with_the_recurrence_as_kernels(cls, gates, bidirectional):
    batch, steps, in_size, hidden, layers = 4, 10, 24, 32, 2
    dirs = 2 if bidirectional else 1
    g = capture(cls(in_size, hidden, num_layers=layers, batch_first=True, bidirectional=bidirectional),
                (torch.zeros(batch, steps, in_size),), mode="inference")
    (node,) = _rnn_nodes(g)
    assert node.name().startswith("cudnn.")
    # per layer and direction: one input GEMM over all steps, then a GEMM and a pointwise kernel a step
    assert node.kernels == layers * dirs * (1 + 2 * steps)
    inputs = [in_size, hidden * dirs]
    assert _gemm_flops(node.op) == _forward_gemm_flops(steps, batch, inputs, hidden, gates, dirs)
    assert not g.unknown_ops()


def test_time_major_input_reads_steps_from_the_first_dim():
    g = capture(nn.GRU(8, 16), (torch.zeros(12, 3, 8),), mode="inference")  # (T, B, in)
    (node,) = _rnn_nodes(g)
    assert node.kernels == 1 + 2 * 12
    assert _gemm_flops(node.op) == _forward_gemm_flops(12, 3, [8], 16, 3, 1)


def test_training_has_one_backward_node_and_gradients_reach_every_weight():
    batch, steps, in_size, hidden = 4, 6, 8, 16
    lstm = nn.LSTM(in_size, hidden, num_layers=2, dropout=0.2, batch_first=True)
    g = capture(lstm, (torch.zeros(batch, steps, in_size),), mode="train")
    fwd, bwd = _rnn_nodes(g)
    assert (fwd.phase, bwd.phase) == ("fwd", "bwd") and bwd.name() == "cudnn.lstm_backward"
    # training forward: a dropout on the first layer's output feeds the second
    assert fwd.kernels == 2 * (1 + 2 * steps) + 1
    # backward per layer: pointwise + dh GEMM a step; dx, dW_ih, dW_hh, bias sums; the dropout's
    assert bwd.kernels == 2 * (2 * steps + 4) + 1
    # backward GEMM work is twice the forward's: dx and dh mirror x W_ih and h W_hh, dW the same again
    assert _gemm_flops(bwd.op) == pytest.approx(2 * _gemm_flops(fwd.op))
    assert bwd.deps and max(bwd.deps) > fwd.id
    # cuDNN's reserve space (gates, h and c per step) is counted as saved activations
    reserve = 2 * steps * batch * (4 * hidden + 2 * hidden) * 4
    assert g.meta["activation_bytes"] >= reserve


def test_cells_are_two_gemms_and_one_fused_kernel():
    g = capture(nn.LSTMCell(8, 16), (torch.zeros(5, 8),), mode="train")
    fwd, bwd = _rnn_nodes(g)
    assert fwd.kernels == 3
    assert _gemm_flops(fwd.op) == 2 * 5 * (8 + 16) * 4 * 16
    # backward: the fused cell's pointwise kernel and bias sums, dW_ih and dW_hh; no dx GEMM
    # (the input is data) and no dh GEMM (h_0 is zeros): autograd skips both
    assert bwd.kernels == 4 and _gemm_flops(bwd.op) == _gemm_flops(fwd.op)


class _CellLoop(nn.Module):
    """A cell over every step; `frozen` names cell parameters without gradients, and
    `input_grad` scales the input by a trained vector (no GEMM) so the cell's input needs one."""

    def __init__(self, cls, in_size, hidden, frozen=(), input_grad=False):
        super().__init__()
        self.cell = cls(in_size, hidden)
        for name in frozen:
            getattr(self.cell, name).requires_grad_(False)
        self.scale = nn.Parameter(torch.ones(in_size)) if input_grad else None

    def forward(self, x):
        if self.scale is not None:
            x = x * self.scale
        hx = None
        for t in range(x.shape[1]):
            hx = self.cell(x[:, t], hx)
        return (hx[0] if isinstance(hx, tuple) else hx).sum()


@pytest.mark.parametrize("frozen", [(), ("weight_ih", "weight_hh"), ("weight_ih",),
                                    ("weight_hh", "bias_ih"), ("bias_ih", "bias_hh")])
@pytest.mark.parametrize("input_grad", [False, True])
@pytest.mark.parametrize("cls", [nn.LSTMCell, nn.GRUCell])
def test_cell_loop_backward_gemms_match_torchs_flop_counter(cls, input_grad, frozen):
    """Cells run as autograd's matmuls on a GPU too (torch's lstm_cell: matmul_ih, matmul_hh,
    then _thnn_fused_lstm_cell), so FlopCounterMode on the CPU counts the GEMMs a GPU runs:
    each matmul's dW only for its own weight, dx only where the input needs a gradient."""
    from torch.utils.flop_counter import FlopCounterMode

    batch, steps, in_size, hidden = 4, 5, 24, 32
    x = torch.randn(batch, steps, in_size)
    with FlopCounterMode(display=False) as counter:
        _CellLoop(cls, in_size, hidden, frozen, input_grad)(x).backward()
    g = capture(_CellLoop(cls, in_size, hidden, frozen, input_grad), (x,), mode="train")
    kit = sum(_gemm_flops(n.op) for n in _rnn_nodes(g))
    assert kit == counter.get_total_flops()


@pytest.mark.parametrize("frozen", ["_l1", "weight", "bias"])
def test_partly_frozen_recurrent_weights_keep_every_weight_gradient_gemm(frozen):
    """cuDNN's weight gradients are all or nothing (output_mask[3] is any flattened weight's
    requires_grad): one frozen layer, or frozen matrices under trained biases, keep every dW."""
    lstm = nn.LSTM(8, 16, num_layers=2, bidirectional=True)
    for name, p in lstm.named_parameters():
        p.requires_grad_(frozen not in name)
    g = capture(lstm, (torch.zeros(6, 4, 8),), mode="train")
    fwd, bwd = _rnn_nodes(g)
    assert _gemm_flops(bwd.op) == pytest.approx(2 * _gemm_flops(fwd.op))
    assert bwd.kernels == 2 * 2 * (2 * 6 + 4)


def test_frozen_recurrent_weights_get_no_weight_gradient_gemms():
    """A frozen LSTM under a trained layer still passes gradients back (cuDNN's backward-data
    pass: dx and the per-step dh GEMMs) but runs no dW GEMMs and no bias sums."""
    batch, steps, in_size, hidden = 4, 6, 8, 16

    class Frozen(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed, self.lstm = nn.Linear(in_size, in_size), nn.LSTM(in_size, hidden, 2)
            self.lstm.requires_grad_(False)

        def forward(self, x):
            return self.lstm(self.embed(x))[0].sum()

    g = capture(Frozen(), (torch.zeros(steps, batch, in_size),), mode="train")
    fwd, bwd = _rnn_nodes(g)
    assert _gemm_flops(bwd.op) == pytest.approx(_gemm_flops(fwd.op))  # dx and dh mirror forward
    assert bwd.kernels == 2 * (2 * steps + 1)


def test_an_eval_mode_lstm_has_no_dropout_masks_in_backward():
    """Dropout between layers runs only in training mode: its backward multiplies do neither."""
    steps, layers = 6, 3

    class EvalLstm(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed, self.lstm = nn.Linear(8, 8), nn.LSTM(8, 16, layers, dropout=0.3)

        def forward(self, x):
            self.lstm.eval()
            return self.lstm(self.embed(x))[0].sum()

    with pytest.warns(UserWarning, match="can only be called in training mode"):  # cuDNN's refusal
        g = capture(EvalLstm(), (torch.zeros(steps, 4, 8),), mode="train")
    fwd, bwd = _rnn_nodes(g)
    assert fwd.kernels == layers * (1 + 2 * steps)
    assert bwd.kernels == layers * (2 * steps + 4)


def test_the_eval_mode_note_names_each_recurrent_module_once_on_the_command_line(tmp_path, monkeypatch,
                                                                                 capsys):
    """Two eval-mode LSTMs, each called over 3 steps (6 backward calls, a cell in train mode
    beside them): kit predict notes each module once, by name, and the train-mode cell not at
    all. The note had read only "cudnn.lstm", so Python showed one line for both modules."""
    (tmp_path / "rnnnote_model.py").write_text(
        "import torch, torch.nn as nn\n"
        "class Two(nn.Module):\n"
        "    def __init__(self):\n"
        "        super().__init__()\n"
        "        self.enc, self.dec = nn.LSTM(8, 16, 3), nn.LSTM(16, 16)\n"
        "        self.cell = nn.LSTMCell(16, 16)\n"
        "    def train(self, mode=True):\n"
        "        super().train(mode)\n"
        "        self.enc.eval(); self.dec.eval()\n"
        "        return self\n"
        "    def forward(self, x):\n"
        "        out = 0\n"
        "        for t in range(3):\n"
        "            h = self.dec(self.enc(x[t:t + 2])[0])[0]\n"
        "            out = out + self.cell(h[0])[0].sum()\n"
        "        return out\n"
        "def make():\n"
        "    return Two(), (torch.zeros(6, 4, 8, requires_grad=True),)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    from kit.cli import main

    assert main(["predict", "rnnnote_model:make", "--gpu", "h100-sxm", "--json"]) == 0
    notes = [line for line in capsys.readouterr().err.splitlines() if "training mode" in line]
    assert len(notes) == 2, notes
    assert sorted(n.split("note: ", 1)[1].split()[0] for n in notes) == ["dec", "enc"]


@pytest.mark.parametrize("case", ["packed", "projection"])
def test_forms_cudnn_is_not_modelled_for_keep_their_decomposition(case):
    class Packed(nn.Module):
        def __init__(self):
            super().__init__()
            self.lstm = nn.LSTM(8, 16)

        def forward(self, x):
            packed = nn.utils.rnn.pack_padded_sequence(x, [5, 5])
            return self.lstm(packed)[0].data

    model = Packed() if case == "packed" else nn.LSTM(8, 16, proj_size=4)
    g = capture(model, (torch.zeros(5, 2, 8),), mode="inference")
    assert not _rnn_nodes(g)
    assert any(n.op_class == "gemm" for n in g.kernels())


def test_fused_rnn_predicts_faster_than_its_decomposition_on_a_gpu():
    from kit.api import predict_model

    lstm, x = nn.LSTM(64, 128, batch_first=True), torch.zeros(8, 32, 64)
    fused = predict_model(lstm, "a100-pcie-80gb", mode="inference", inputs=(x,))
    # the same recurrence written out step by step: what the capture recorded before
    class Unrolled(nn.Module):
        def __init__(self):
            super().__init__()
            self.cell = nn.LSTMCell(64, 128)

        def forward(self, x):
            h = c = x.new_zeros(x.shape[0], 128)
            for t in range(x.shape[1]):
                gates = x[:, t] @ self.cell.weight_ih.t() + h @ self.cell.weight_hh.t()
                i, f, g, o = gates.chunk(4, 1)
                c = f.sigmoid() * c + i.sigmoid() * g.tanh()
                h = o.sigmoid() * c.tanh()
            return h

    unrolled = predict_model(Unrolled(), "a100-pcie-80gb", mode="inference", inputs=(x,))
    assert fused.to_dict()["kernels"] < unrolled.to_dict()["kernels"] / 3
    assert fused.total_ms < unrolled.total_ms


def test_bad_recurrent_shapes_are_refused():
    with pytest.raises(KitError, match="hidden"):
        RnnShape("lstm", 4, 2, 8, 0)
    with pytest.raises(KitError, match="recurrent kind"):
        RnnShape("lstmx", 4, 2, 8, 16)
    with pytest.raises(KitError, match="directions"):
        RnnShape("gru", 4, 2, 8, 16, directions=3)
    op, kernels = forward(RnnShape("gru", 4, 2, 8, 16))
    assert kernels == 9 and op.flops > 0 and backward(RnnShape("gru", 4, 2, 8, 16))[1] == 12
