"""Small torch building blocks the learned predictors share: a standardising MLP and a seeded
training loop. Importing this module imports torch; the rest of kit.predict imports it lazily."""
from __future__ import annotations

import math

import numpy as np
import torch
from torch import nn


def set_threads(n: int = 2) -> None:
    """Cap torch's intra-op threads (the kit trains on small shared CPUs)."""
    torch.set_num_threads(max(1, int(n)))


class MLP(nn.Module):
    """x -> clamp to the training range -> standardise -> [Linear, SiLU] × depth -> Linear(out).

    Clamping keeps a GPU or shape beyond anything seen in training at the edge of what was
    seen instead of extrapolating the network's last linear pieces. The range, mean and std
    are buffers, so they travel in the state_dict with the weights."""

    def __init__(self, n_in: int, n_out: int, hidden: int = 64, depth: int = 2):
        super().__init__()
        self.register_buffer("x_mean", torch.zeros(n_in))
        self.register_buffer("x_std", torch.ones(n_in))
        self.register_buffer("x_min", torch.full((n_in,), -1e30))
        self.register_buffer("x_max", torch.full((n_in,), 1e30))
        layers: list[nn.Module] = []
        width = n_in
        for _ in range(depth):
            layers += [nn.Linear(width, hidden), nn.SiLU()]
            width = hidden
        layers.append(nn.Linear(width, n_out))
        self.net = nn.Sequential(*layers)

    def set_scale(self, x: np.ndarray) -> None:
        x = torch.as_tensor(x, dtype=torch.float32)
        self.x_min.copy_(x.min(0).values)
        self.x_max.copy_(x.max(0).values)
        self.x_mean.copy_(x.mean(0))
        self.x_std.copy_(x.std(0).clamp_min(1e-6) if len(x) > 1 else torch.ones(x.shape[1]))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.minimum(torch.maximum(x, self.x_min), self.x_max)
        return self.net((x - self.x_mean) / self.x_std)


def fit(model: nn.Module, x: np.ndarray, loss_fn, *, epochs: int, seed: int, batch: int = 2048,
        lr: float = 4e-3, weight_decay: float = 1e-5, sample_weight: np.ndarray | None = None,
        min_steps: int = 300, progress=None) -> list[float]:
    """Train with Adam and a cosine learning-rate decay, shuffling with a seeded generator.

    loss_fn(output, index_tensor) -> per-sample loss (the caller holds the targets). Returns the
    mean loss of each epoch. `progress(n)` is called after each epoch (a tqdm update, say).
    """
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    xt = torch.as_tensor(x, dtype=torch.float32)
    w = torch.ones(len(xt)) if sample_weight is None else torch.as_tensor(sample_weight,
                                                                          dtype=torch.float32)
    w = w / w.mean()
    batch = min(batch, len(xt))
    per_epoch = math.ceil(len(xt) / batch)
    passes = max(epochs, math.ceil(min_steps / per_epoch))
    opt = torch.optim.Adam(model.parameters(), lr=lr, weight_decay=weight_decay)
    steps = max(1, passes * per_epoch)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: 0.5 * (1 + math.cos(math.pi * min(s, steps) / steps)) * 0.98 + 0.02)
    history = []
    model.train()
    for e in range(passes):
        order = torch.randperm(len(xt), generator=gen)
        total = 0.0
        for start in range(0, len(xt), batch):
            idx = order[start:start + batch]
            loss = (loss_fn(model(xt[idx]), idx) * w[idx]).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            sched.step()
            total += float(loss.detach()) * len(idx)
        history.append(total / len(xt))
        if progress is not None and (e + 1) * epochs // passes > e * epochs // passes:
            progress(1)
    model.eval()
    return history


def pinball(log_pred: torch.Tensor, log_true: torch.Tensor, quantiles) -> torch.Tensor:
    """Quantile (pinball) loss per sample, summed over the quantile columns of log_pred."""
    q = torch.as_tensor(quantiles, dtype=log_pred.dtype)
    diff = log_true[:, None] - log_pred
    return torch.maximum(q * diff, (q - 1) * diff).sum(1)


def predict(model: nn.Module, x: np.ndarray, batch: int = 65536) -> np.ndarray:
    with torch.no_grad():
        xt = torch.as_tensor(np.asarray(x), dtype=torch.float32)
        return torch.cat([model(xt[i:i + batch]) for i in range(0, max(len(xt), 1), batch)]
                         ).numpy() if len(xt) else np.zeros((0, model.net[-1].out_features))
