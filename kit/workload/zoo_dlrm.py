"""The zoo's DLRM (Naumov et al. 2019)."""
from __future__ import annotations

import torch
import torch.nn as nn


def _mlp(sizes, sigmoid_last=False):
    layers = []
    for i, (a, b) in enumerate(zip(sizes[:-1], sizes[1:])):
        layers += [nn.Linear(a, b), nn.Sigmoid() if sigmoid_last and i == len(sizes) - 2 else nn.ReLU()]
    return nn.Sequential(*layers)


class DLRM(nn.Module):
    """DLRM (Naumov et al. 2019): bottom MLP on dense features, pooled embedding bags on sparse
    features, pairwise dot-product interaction, top MLP."""

    def __init__(self, c):
        super().__init__()
        self.config = c
        dim = c["embedding_dim"]
        self.pooling = c.get("pooling", 1)
        self.bot = _mlp([c["dense_features"], *c["bottom_mlp"], dim])
        self.tables = nn.ModuleList(nn.EmbeddingBag(rows, dim, mode="sum") for rows in c["table_rows"])
        n = len(c["table_rows"]) + 1
        self.top = _mlp([dim + n * (n - 1) // 2, *c["top_mlp"], 1], sigmoid_last=True)
        self.register_buffer("tri", torch.empty(n * (n - 1) // 2, dtype=torch.long), persistent=False)

    def forward(self, dense, indices, offsets):
        x = self.bot(dense)
        ys = [t(indices[i], offsets[i]) for i, t in enumerate(self.tables)]
        z = torch.stack([x, *ys], dim=1)
        inter = torch.bmm(z, z.transpose(1, 2)).flatten(1).index_select(1, self.tri)
        return self.top(torch.cat([x, inter], dim=1))

    def example_inputs(self, batch, seq=None):
        t = len(self.config["table_rows"])
        dense = torch.empty(batch, self.config["dense_features"], device="meta")
        idx = torch.zeros(t, batch * self.pooling, dtype=torch.long, device="meta")
        off = torch.zeros(t, batch, dtype=torch.long, device="meta")
        return (dense, idx, off)
