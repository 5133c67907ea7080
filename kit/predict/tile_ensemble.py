"""The tile-MLP's ensembles: one per op class, members with three quantile heads (p10, p50,
p90 of log latency), and how their answers combine into a centre and an 80% band (combine,
sigma_at_distance). kit.predict.tile_mlp is the predictor built on them."""
from __future__ import annotations

import numpy as np

QUANTILES = (0.1, 0.5, 0.9)
Z80 = 1.2816  # standard normal 90th percentile: ±Z80·σ spans 80%


def heads_to_log_latency(out, log_base):
    """Network outputs (n, 3) -> log-latency quantiles (n, 3) [p10, p50, p90], each ≥ log_base.

    Head 0 is the median utilisation's logit; heads 1 and 2 move it up (faster, p10) and down
    (slower, p90) by a softplus, so the quantiles never cross."""
    import torch
    from torch.nn.functional import logsigmoid, softplus

    z = out[:, 0]
    fast = z + softplus(out[:, 1])
    slow = z - softplus(out[:, 2])
    return log_base[:, None] - torch.stack([logsigmoid(fast), logsigmoid(z), logsigmoid(slow)], 1)


def direct_heads(out, log_base):
    """The direct MLP's heads: log latency itself (plus log_base, zero there), and two widths."""
    from torch.nn.functional import softplus
    import torch

    c = out[:, 0] + log_base
    return torch.stack([c - softplus(out[:, 1]), c, c + softplus(out[:, 2])], 1)


HEADS = {"utilisation": heads_to_log_latency, "direct": direct_heads}


def heads_to_log_latency_np(out: np.ndarray, log_base: np.ndarray) -> np.ndarray:
    """heads_to_log_latency in numpy (for the numpy-loaded weights)."""
    from kit.predict.array_mlp import logsigmoid, softplus

    z = out[:, 0]
    fast, slow = z + softplus(out[:, 1]), z - softplus(out[:, 2])
    return log_base[:, None] - np.stack([logsigmoid(fast), logsigmoid(z), logsigmoid(slow)], 1)


def direct_heads_np(out: np.ndarray, log_base: np.ndarray) -> np.ndarray:
    """direct_heads in numpy."""
    from kit.predict.array_mlp import softplus

    c = out[:, 0] + log_base
    return np.stack([c - softplus(out[:, 1]), c, c + softplus(out[:, 2])], 1)


HEADS_NP = {"utilisation": heads_to_log_latency_np, "direct": direct_heads_np}


class ClassModel:
    """The ensemble for one op class."""

    def __init__(self, op_class: str, members: list, hidden: int, mode: str = "utilisation",
                 n_in: int | None = None):
        self.op_class, self.members, self.hidden, self.mode = op_class, members, hidden, mode
        self.n_in = n_in if n_in is not None else int(members[0].x_mean.numel())

    @staticmethod
    def fit(op_class: str, x: np.ndarray, log_base: np.ndarray, log_y: np.ndarray,
            weight: np.ndarray, *, seed: int, members: int = 3, epochs: int = 30,
            hidden: int = 64, mode: str = "utilisation", min_steps: int = 300,
            progress=None) -> "ClassModel":
        import torch

        from kit.predict.nets import MLP, fit, pinball

        lb = torch.as_tensor(log_base, dtype=torch.float32)
        ly = torch.as_tensor(log_y, dtype=torch.float32)
        heads = HEADS[mode]
        nets = []
        for i in range(members):
            torch.manual_seed(seed + i)
            net = MLP(x.shape[1], 3, hidden=hidden, depth=2)
            net.set_scale(x)
            with torch.no_grad():  # start near utilisation 0.5 (or the mean) with a narrow band
                start = 0.0 if mode == "utilisation" else float(ly.mean())
                net.net[-1].bias.copy_(torch.tensor([start, -1.0, -1.0]))
            fit(net, x, lambda out, idx: pinball(heads(out, lb[idx]), ly[idx], QUANTILES),
                epochs=epochs, seed=seed + i, sample_weight=weight, min_steps=min_steps,
                progress=progress)
            nets.append(net)
        return ClassModel(op_class, nets, hidden, mode)

    def log_quantiles(self, x: np.ndarray, log_base: np.ndarray) -> np.ndarray:
        """(members, n, 3) log-latency quantiles."""
        from kit.predict.array_mlp import ArrayMLP

        if all(isinstance(m, ArrayMLP) for m in self.members):  # loaded weights: no torch
            lb = np.asarray(log_base, dtype=np.float32)
            x32 = np.asarray(x, dtype=np.float32)
            return np.stack([HEADS_NP[self.mode](m(x32), lb) for m in self.members]).astype(float)
        import torch

        lb = torch.as_tensor(log_base, dtype=torch.float32)
        with torch.no_grad():
            xt = torch.as_tensor(x, dtype=torch.float32)
            heads = HEADS[self.mode]
            return np.stack([heads(m(xt), lb).numpy() for m in self.members])

    def state(self, prefix: str = "") -> tuple[dict, dict]:
        tensors = {f"{prefix}{self.op_class}.{i}.{k}": v for i, m in enumerate(self.members)
                   for k, v in m.state_dict().items()}
        return tensors, {"members": len(self.members), "hidden": self.hidden,
                         "n_in": self.n_in, "mode": self.mode}

    @staticmethod
    def from_state(op_class: str, tensors: dict, meta: dict, prefix: str = "") -> "ClassModel":
        from kit.predict.array_mlp import ArrayMLP

        members, mode = meta["members"], meta.get("mode", "utilisation")
        if isinstance(members, bool) or not isinstance(members, int) or members < 1:
            raise ValueError(f"{op_class}: members must be a whole number >= 1, got {members!r}")
        if mode not in HEADS:
            raise ValueError(f"{op_class}: mode must be one of {', '.join(HEADS)}, got {mode!r}")
        nets = []
        for i in range(members):
            head = f"{prefix}{op_class}.{i}."
            nets.append(ArrayMLP({k[len(head):]: v for k, v in tensors.items() if k.startswith(head)},
                                 meta["n_in"], 3, hidden=meta["hidden"], depth=2))
        return ClassModel(op_class, nets, meta["hidden"], mode, meta["n_in"])


def combine(logq: np.ndarray, transfer_sigma: float = 0.0):
    """Ensemble (members, n, 3) -> (log p50, log p10, log p90) per op.

    half-width² = head width² + (Z80 · member spread)² + (Z80 · transfer σ)²"""
    centre = logq[:, :, 1].mean(0)
    spread = logq[:, :, 1].std(0) if len(logq) > 1 else np.zeros_like(centre)
    extra = (Z80 * spread) ** 2 + (Z80 * transfer_sigma) ** 2
    down = np.sqrt(((logq[:, :, 1] - logq[:, :, 0]) ** 2).mean(0) + extra)
    up = np.sqrt(((logq[:, :, 2] - logq[:, :, 1]) ** 2).mean(0) + extra)
    return centre, centre - down, centre + up


def sigma_at_distance(sigma_0: float, sigma_far: float, distance: float, near: float) -> float:
    """The transfer σ at a GPU's distance to the nearest training GPU: σ_0 (the in-distribution
    anchor) at 0, σ_far (the leave-one-GPU-out anchor) from `near` (the closest left-out
    transfer) on, linear in between; never below σ_0, never decreasing with distance."""
    sigma_far = max(sigma_far, sigma_0)
    share = 1.0 if near <= 0 else min(1.0, max(0.0, distance) / near)
    return sigma_0 + (sigma_far - sigma_0) * share
