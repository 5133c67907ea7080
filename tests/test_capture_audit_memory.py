"""From the capture audit: a training step's memory. Activations are what autograd saves less the
weights it saves (a GEMM keeps W for dx; the reference is real torch's saved tensors on the CPU),
and gradients and optimizer state are those of the trainable parameters only (a frozen backbone
has neither)."""
import pytest
import torch
import torch.nn as nn

from kit.workload.capture import capture
from kit.workload.models import OPTIMIZER_STATE_TENSORS, memory_bytes


def _saved_activation_bytes(model, x):
    """The bytes real torch saves for the backward, less the parameters' storages."""
    weights = {p.untyped_storage().data_ptr() for p in model.parameters()}
    saved = {}

    def pack(t):
        ptr = t.untyped_storage().data_ptr()
        if ptr not in weights:
            saved[ptr] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(x)
    return sum(saved.values())


@pytest.mark.parametrize("batch", [1, 8])
def test_activations_leave_out_the_weights_autograd_saves(batch):
    """A 2-layer MLP of 1024x1024 weights at batch 1 reported 8 MiB of activations: its weights."""
    mlp = nn.Sequential(nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 1024))
    x = torch.randn(batch, 1024, requires_grad=True)
    g = capture(mlp, (x,), mode="train")
    assert g.meta["activation_bytes"] == _saved_activation_bytes(mlp, x)
    assert memory_bytes(g)["activations_bytes"] < g.meta["param_bytes"] / 100


def _frozen_backbone():
    m = nn.Sequential(*[nn.Linear(256, 256, bias=False) for _ in range(4)], nn.Linear(256, 8))
    for p in m[:4].parameters():
        p.requires_grad_(False)
    return m


@pytest.mark.parametrize("optimizer", [None, "adamw", "sgd"])
def test_gradients_and_optimizer_state_are_the_trainable_parameters(optimizer):
    """A frozen backbone and a small head showed gradients and AdamW state for every parameter."""
    m = _frozen_backbone()
    g = capture(m, (torch.randn(4, 256),), mode="train", dtype="bf16", optimizer=optimizer)
    trainable = sum(p.numel() * 2 for p in m.parameters() if p.requires_grad)  # bf16: 2 bytes
    mem = memory_bytes(g)
    assert mem["weights_bytes"] == sum(p.numel() * 2 for p in m.parameters())
    assert mem["grads_bytes"] == trainable
    assert mem["optimizer_bytes"] == OPTIMIZER_STATE_TENSORS[optimizer or "adamw"] * trainable


def test_the_optimizer_step_updates_the_trainable_parameters_only():
    m = _frozen_backbone()
    g = capture(m, (torch.randn(4, 256),), mode="train", optimizer="adamw")
    trainable = sum(p.numel() for p in m.parameters() if p.requires_grad)
    steps = [n.op for n in g.nodes if n.phase == "opt" and n.op is not None]
    assert steps and max(op.numel for op in steps) == trainable


def test_a_graph_without_trainable_bytes_counts_every_parameter():
    """A graph cached before the field existed: gradients for all of its parameters, as before."""
    g = capture(nn.Linear(64, 64), (torch.randn(2, 64),), mode="train")
    del g.meta["trainable_param_bytes"]
    assert memory_bytes(g)["grads_bytes"] == g.meta["param_bytes"]
