"""The zoo's mixture-of-experts block, as Hugging Face transformers 5 runs it (Mixtral, Qwen2-MoE,
Qwen3-MoE, DeepSeek-V3; transformers.integrations.moe).

HF 5 keeps a layer's routed experts as two 3-D weights, gate_up_proj (E, 2I, H) and down_proj
(E, H, I), and runs them one of three ways, chosen by the config key `experts_implementation`:

* "grouped_mm", HF's default: the T·k (token, expert) pairs are sorted by expert (sort), the
  tokens gathered in that order, the experts' row counts taken (histc) and summed into offsets
  (cumsum); one grouped GEMM up, the gate, one grouped GEMM down, the routing weights; the pairs
  put back in token order and the k results of each token summed.
* "batched_mm": each token repeated k times, each pair's expert weights gathered (T·k copies of
  an expert's matrices), one bmm up and one down with a row per pair. HF's generate switches
  grouped_mm to batched_mm for its decode steps on GPUs, so a decode step here (mode decode, a
  forward with a KV cache) runs batched_mm where the config asks for grouped_mm.
* "eager": a loop over the experts that got tokens, each two GEMMs on its tokens and an
  index_add_ into the output. Which experts and how many tokens each depends on the routing,
  which the capture cannot see: here min(E, T·k) experts run, each on an even share of the T·k
  pairs, picked by a topk over the routing weights (standing in for HF's torch.where).

The grouped GEMM is costed as a batch of even GEMMs over the experts its rows reach
(kit.workload.mapping). On GPUs before Ampere HF falls back to one GEMM per expert, which the
capture does not tell apart: it is captured once for every GPU.
"""
from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

IMPLEMENTATIONS = ("grouped_mm", "batched_mm", "eager")
_GROUPED_MM = getattr(F, "grouped_mm", None) or getattr(torch, "_grouped_mm", None)


def activate(act: str, x):
    """The gated MLP's activation: silu (SwiGLU) or gelu, tanh-approximated for Gemma's GeGLU."""
    if act == "silu":
        return F.silu(x)
    return F.gelu(x, approximate="tanh" if act == "gelu_pytorch_tanh" else "none")


class Experts(nn.Module):
    """E experts of width I over a model of width H, as HF 5's <Family>Experts store them:
    gate_up_proj (E, 2I, H) and down_proj (E, H, I). oai (GPT-OSS): stored transposed,
    (E, H, 2I) and (E, I, H), with a bias on each, gate and up interleaved in the 2I columns, and
    a clamped SwiGLU, (clamp(up) + 1) * g * sigmoid(alpha * g) with g = clamp(gate, max=limit)."""

    def __init__(self, experts: int, d: int, inter: int, act: str = "silu", oai: dict | None = None):
        super().__init__()
        self.oai = oai
        if oai is None:
            self.gate_up_proj = nn.Parameter(torch.empty(experts, 2 * inter, d))
            self.down_proj = nn.Parameter(torch.empty(experts, d, inter))
        else:
            self.gate_up_proj = nn.Parameter(torch.empty(experts, d, 2 * inter))
            self.gate_up_proj_bias = nn.Parameter(torch.empty(experts, 2 * inter))
            self.down_proj = nn.Parameter(torch.empty(experts, inter, d))
            self.down_proj_bias = nn.Parameter(torch.empty(experts, d))
        self.act = act

    @property
    def num_experts(self) -> int:
        return self.gate_up_proj.shape[0]

    def _gated(self, h):
        if self.oai is not None:
            gate, up = h[..., ::2].clamp(max=self.oai["limit"]), h[..., 1::2]
            up = up.clamp(min=-self.oai["limit"], max=self.oai["limit"])
            return (up + 1) * (gate * torch.sigmoid(gate * self.oai["alpha"]))
        gate, up = h.chunk(2, dim=-1)
        return activate(self.act, gate) * up

    def _weight(self, w):
        """A weight as x @ w takes it per expert: (E, in, out)."""
        return w if self.oai is not None else w.transpose(-2, -1)

    def forward(self, x, index, weights, implementation: str = "grouped_mm"):
        """x: (T, H) tokens; index, weights: (T, k) each token's experts and routing weights."""
        if implementation == "grouped_mm" and _GROUPED_MM is not None:
            return self._grouped(x, index, weights)
        if implementation == "batched_mm":
            return self._batched(x, index, weights)
        return self._eager(x, index, weights)

    def _grouped(self, x, index, weights):
        t, k = index.shape
        ids, perm = torch.sort(index.reshape(-1))
        xs = x[perm // k]
        w = weights.reshape(-1)[perm]
        counts = torch.histc(ids.int(), bins=self.num_experts, min=0, max=self.num_experts - 1)
        offs = torch.cumsum(counts, dim=0, dtype=torch.int32)
        h = _GROUPED_MM(xs, self._weight(self.gate_up_proj), offs=offs)
        if self.oai is not None:  # each row's expert bias, gathered and added in place
            h.add_(self.gate_up_proj_bias[ids])
        y = _GROUPED_MM(self._gated(h), self._weight(self.down_proj), offs=offs)
        if self.oai is not None:
            y.add_(self.down_proj_bias[ids])
        y = y * w.unsqueeze(-1)
        back = torch.empty_like(perm)
        back[perm] = torch.arange(perm.shape[0], device=perm.device)
        return y[back].view(t, k, -1).sum(dim=1).to(x.dtype)

    def _batched(self, x, index, weights):
        t, k = index.shape
        ids = index.reshape(-1)
        xs = x.repeat_interleave(k, dim=0)
        h = self._rows(xs, self.gate_up_proj[ids])
        if self.oai is not None:
            h.add_(self.gate_up_proj_bias[ids])
        y = self._rows(self._gated(h), self.down_proj[ids])
        if self.oai is not None:
            y.add_(self.down_proj_bias[ids])
        y = y * weights.reshape(-1).unsqueeze(-1)
        return y.view(t, k, -1).sum(dim=1).to(x.dtype)

    def _rows(self, rows, w):
        """Each row through its own gathered weight (HF's _batched_linear)."""
        if self.oai is not None:  # (S, 1, in) @ (S, in, out)
            return torch.bmm(rows.unsqueeze(1), w).squeeze(1)
        return torch.bmm(w, rows.unsqueeze(-1)).squeeze(-1)  # (S, out, in) @ (S, in, 1)

    def _eager(self, x, index, weights):
        t, k = index.shape
        active = min(self.num_experts, t * k)
        share = min(math.ceil(t * k / active), t)  # each running expert's (token, expert) pairs
        flat = weights.reshape(-1)
        out = torch.zeros_like(x)
        for e in range(active):
            w, pairs = torch.topk(flat, share)  # stands in for HF's torch.where on the expert's mask
            tokens = pairs // k
            if self.oai is not None:  # GPT-OSS's own loop: x @ W + b
                h = self._gated(x[tokens] @ self.gate_up_proj[e] + self.gate_up_proj_bias[e])
                y = (h @ self.down_proj[e] + self.down_proj_bias[e]) * w.unsqueeze(-1)
            else:
                h = self._gated(F.linear(x[tokens], self.gate_up_proj[e]))
                y = F.linear(h, self.down_proj[e]) * w.unsqueeze(-1)
            out.index_add_(0, tokens, y.to(out.dtype))
        return out


class TopKMoE(nn.Module):
    """A router, the routed experts and optional shared experts. The router: a softmax over the
    logits in fp32 and the top k (Mixtral, Qwen-MoE; normalised to sum to one with
    norm_topk_prob; weights cast back to the model's dtype with `cast`, as Qwen's router does,
    kept in fp32 as Mixtral's); subclasses route otherwise (DeepSeek, GPT-OSS). `shared`: an MLP
    every token goes through, behind a sigmoid gate (Qwen2-MoE) or added as it is (gated_shared
    False: DeepSeek). `oai`: GPT-OSS's experts (Experts) and a router with a bias."""

    def __init__(self, d: int, experts: int, top_k: int, inter: int, act: str = "silu",
                 implementation: str = "grouped_mm", normalize: bool = True, cast: bool = False,
                 shared: nn.Module | None = None, gated_shared: bool = True, oai: dict | None = None):
        super().__init__()
        if top_k > experts:
            raise ValueError(f"num_experts_per_tok {top_k} is more than the {experts} experts")
        if implementation not in IMPLEMENTATIONS:
            raise ValueError(f"experts_implementation {implementation!r} is not one of "
                             f"{', '.join(IMPLEMENTATIONS)}")
        self.gate = nn.Linear(d, experts, bias=oai is not None)  # GPT-OSS's router has a bias
        self.experts = Experts(experts, d, inter, act, oai)
        self.top_k, self.normalize, self.cast, self.implementation = top_k, normalize, cast, implementation
        self.shared_expert = shared
        self.shared_expert_gate = (nn.Linear(d, 1, bias=False) if shared is not None and gated_shared
                                   else None)

    def route(self, x):
        """(weights, index), each (T, k): the experts each token goes to and their weights."""
        probs = F.softmax(self.gate(x).float(), dim=-1)
        weights, index = torch.topk(probs, self.top_k, dim=-1)
        if self.normalize:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        return (weights.to(x.dtype) if self.cast else weights), index

    def forward(self, x, decode: bool = False):
        shape = x.shape
        x = x.reshape(-1, shape[-1])
        weights, index = self.route(x)
        how = "batched_mm" if decode and self.implementation == "grouped_mm" else self.implementation
        out = self.experts(x, index, weights, how)
        if self.shared_expert_gate is not None:
            out = out + torch.sigmoid(self.shared_expert_gate(x)) * self.shared_expert(x)
        elif self.shared_expert is not None:
            out = out + self.shared_expert(x)
        return out.view(shape)


class OaiMoE(TopKMoE):
    """GPT-OSS's MoE (HF's GptOssMLP): a router with a bias, top k of its logits, a softmax over
    those k only (in the logits' dtype); the oai experts (Experts). No shared expert."""

    def __init__(self, d: int, experts: int, top_k: int, inter: int, implementation: str = "grouped_mm",
                 alpha: float = 1.702, limit: float = 7.0):
        super().__init__(d, experts, top_k, inter, implementation=implementation, normalize=False,
                         oai={"alpha": alpha, "limit": limit})

    def route(self, x):
        top, index = torch.topk(self.gate(x), self.top_k, dim=-1)
        return F.softmax(top, dim=1, dtype=top.dtype), index
