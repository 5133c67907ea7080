"""From the capture audit: the backward a training capture records is the one real torch runs for
a loss over every output (a VAE's (recon, kl), a MoE's (logits, aux_loss), a dict subclass), and
for inputs that require grad (their gradient; checkpoint(use_reentrant=True)). The reference is
real torch on the CPU, its GEMMs counted by a dispatch mode."""
from collections import OrderedDict

import torch
import torch.nn as nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.checkpoint import checkpoint

from kit.workload.capture import capture

GEMMS = {"mm", "addmm", "bmm", "baddbmm"}


class _CountGemms(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.n = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.n += func._opname in GEMMS
        return func(*args, **(kwargs or {}))


def _torch_gemms(model, inputs, loss):
    """(forward, backward) GEMM kernels real torch runs for loss(model(*inputs)).backward()."""
    with _CountGemms() as fwd:
        out = model(*inputs)
        total = loss(out)
    with _CountGemms() as bwd:
        total.backward()
    return fwd.n, bwd.n


def _kit_gemms(graph, phase):
    return sum(n.op_class == "gemm" for n in graph.nodes if n.phase == phase)


class VAE(nn.Module):
    def __init__(self):
        super().__init__()
        self.enc = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 16))
        self.dec = nn.Sequential(nn.Linear(8, 64), nn.ReLU(), nn.Linear(64, 32))

    def forward(self, x):
        mu, logvar = self.enc(x).chunk(2, -1)
        recon = self.dec(mu + logvar.exp())
        kl = -0.5 * (1 + logvar - mu.pow(2) - logvar.exp()).sum(-1).mean()
        return recon, kl


def test_a_scalar_beside_an_output_does_not_drop_the_outputs_backward():
    """A model returning (output, scalar) was backpropagated from the scalar alone: the decoder's
    backward was missing. Real torch trains it on loss(recon) + kl."""
    x = torch.randn(4, 32)
    g = capture(VAE(), (x,), mode="train")
    _, bwd = _torch_gemms(VAE(), (x,), lambda out: out[0].sum() + out[1])
    assert _kit_gemms(g, "bwd") == bwd
    assert any(n.phase == "bwd" and n.module.startswith("dec") for n in g.nodes)


class MoE(nn.Module):  # (logits, aux_loss): the auxiliary loss from the router only
    def __init__(self):
        super().__init__()
        self.router, self.body = nn.Linear(16, 4), nn.Linear(16, 16)

    def forward(self, x):
        aux = self.router(x).softmax(-1).pow(2).mean()
        return self.body(x), aux


def test_logits_beside_an_aux_loss_get_their_gradient():
    x = torch.randn(8, 16)
    _, bwd = _torch_gemms(MoE(), (x,), lambda out: out[0].sum() + out[1])
    assert _kit_gemms(capture(MoE(), (x,), mode="train"), "bwd") == bwd


class Out(OrderedDict):  # an OrderedDict-based output class of one's own (HF's ModelOutput-like)
    pass


class DictOut(nn.Module):
    def __init__(self):
        super().__init__()
        self.l = nn.Linear(16, 16)

    def forward(self, x):
        return Out(logits=self.l(x))


def test_a_dict_subclass_output_trains():
    """It was refused: "does the model have trainable parameters on the output's path?"."""
    x = torch.randn(8, 16)
    _, bwd = _torch_gemms(DictOut(), (x,), lambda out: out["logits"].sum())
    assert _kit_gemms(capture(DictOut(), (x,), mode="train"), "bwd") == bwd


def test_an_input_that_requires_grad_gets_its_gradient():
    """The capture made fresh meta inputs without requires_grad: the first layer's dgrad was
    left out. Real torch computes it for an input that requires grad."""
    mlp = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 32))
    x = torch.randn(16, 32, requires_grad=True)
    _, bwd = _torch_gemms(mlp, (x,), lambda out: out.sum())
    assert _kit_gemms(capture(mlp, (x,), mode="train"), "bwd") == bwd
    assert _kit_gemms(capture(mlp, (x.detach(),), mode="train"), "bwd") == bwd - 1


class Reentrant(nn.Module):
    def __init__(self):
        super().__init__()
        self.b = nn.Sequential(nn.Linear(32, 64), nn.GELU(), nn.Linear(64, 32))

    def forward(self, x):
        return x + checkpoint(self.b, x, use_reentrant=True)


def test_reentrant_checkpointing_on_an_input_that_requires_grad_captures():
    """It failed: "the model's output has no floating tensor that requires grad"."""
    x = torch.randn(16, 32, requires_grad=True)
    fwd, bwd = _torch_gemms(Reentrant(), (x,), lambda out: out.sum())
    g = capture(Reentrant(), (x,), mode="train")
    assert (_kit_gemms(g, "fwd"), _kit_gemms(g, "bwd")) == (fwd, bwd)  # bwd: the recompute too
