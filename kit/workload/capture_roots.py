"""Where a training capture starts its backward pass: the model's outputs that a loss reads.

The capture has no loss of the user's, so it gives a gradient to every floating output that
requires grad, as a loss over all of them would (BERT's two pretraining heads; a VAE's
reconstruction beside its KL term), with one exception: an output that a one-element output
was computed from takes its gradient through it (a loss of shape (1,) as much as a 0-dim one).
A scalar output, a 0-dim tensor, is a loss (HF's {"loss", "logits"}, a MoE's auxiliary loss, a
VAE's KL term: each a reduction to 0 dims) and starts the backward with the seed 1 (torch's
ones_like fill); the logits beside HF's loss are upstream of it, so they get no seed of their
own. A one-element output with dimensions is a batch of one (DLRM's (batch, 1) click
probability at batch 1), seeded as at any other batch: taken for a loss, it had added the seed's
fill kernel at batch 1 alone, and DLRM's bf16 training step on an H100 came out 3.6956 ms at
batch 1, 0.3% over batch 2's 3.6836 (a (1,) loss is seeded so too: one fill kernel less than
torch's backward runs). Each autograd node still runs once: torch sums the gradients that reach
a node before it runs.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import torch
from torch.utils._pytree import tree_leaves

from kit.workload.capture_errors import CaptureNotAboutInputs


def output_tensors(output) -> list:
    """Tensors in a model's output: pytree leaves, and the values of what pytree does not open:
    a dataclass (a user's own output class) and a Mapping subclass (an OrderedDict-based
    ModelOutput of one's own, an EasyDict)."""
    out = []
    for leaf in tree_leaves(output):
        if isinstance(leaf, torch.Tensor):
            out.append(leaf)
        elif dataclasses.is_dataclass(leaf) and not isinstance(leaf, type):
            out += output_tensors([getattr(leaf, f.name) for f in dataclasses.fields(leaf)])
        elif isinstance(leaf, Mapping):
            out += output_tensors(list(leaf.values()))
    return out


def grad_outputs(output) -> list:
    """The floating tensors of a model's output that require grad, in order."""
    return [t for t in output_tensors(output) if t.is_floating_point() and t.requires_grad]


def backward_root(output):
    """The first output a loss can be computed from; a KitError naming the output when none."""
    roots = grad_outputs(output)
    if roots:
        return roots[0]
    # the model's own: no trainable parameter reaches its output (a module without any, an
    # output made by argmax or under torch.no_grad), whatever inputs it was given
    raise CaptureNotAboutInputs(
        "training capture: the model's output has no floating tensor that requires grad (it "
        f"returned a {type(output).__name__}; does the model have trainable parameters on the "
        "output's path?)")


def is_loss(t) -> bool:
    """Whether an output is a loss, a 0-dim tensor (module docstring)."""
    return t.dim() == 0


def _upstream(scalars: list, held: list) -> set:
    """The gradient edges, (id of an autograd node, its output number), that the backward from
    `scalars` passes through. held gets the nodes, so that no id is reused while it is kept."""
    seen = set()
    todo = [torch.autograd.graph.get_gradient_edge(s).node for s in scalars]
    visited = set()
    while todo:
        node = todo.pop()
        if node is None or id(node) in visited:
            continue
        visited.add(id(node))
        held.append(node)
        for nxt, nr in node.next_functions:
            if nxt is not None:
                held.append(nxt)
                seen.add((id(nxt), nr))
                todo.append(nxt)
    return seen


def backward_roots(output) -> list:
    """The roots for torch.autograd.backward: every scalar output, and every other floating
    output requiring grad that no scalar output was computed from (module docstring)."""
    outputs = grad_outputs(output) or [backward_root(output)]  # none: the error naming it
    # any one-element output covers the outputs it was computed from, whatever its dims: a
    # loss kept as (1,) (loss.unsqueeze(0), a keepdim mean) beside its logits had left the
    # logits a seed of their own, their gradient summed with the loss's (a (512, 32000) fp32
    # cross-entropy step's backward 426.6 -> 623.3 MB). Only its seed depends on the dims (seeds)
    scalars = [t for t in outputs if t.numel() == 1]
    held: list = []
    covered = _upstream(scalars, held) if scalars else set()
    edges = [torch.autograd.graph.get_gradient_edge(t) for t in outputs]
    roots = [t for t, e in zip(outputs, edges)
             if t.numel() == 1 or (id(e.node), e.output_nr) not in covered]
    return roots


def seeds(roots: list) -> list:
    """The gradients the backward starts from: 1 for a loss (None: torch fills it), else one of
    the root's shape."""
    return [None if is_loss(t) else torch.empty_like(t) for t in roots]
