"""The GPU work HF's greedy generate() runs around each forward pass, outside the model.

transformers 5.25's GenerationMixin._sample (generation/utils.py), greedy (do_sample False), with
a Llama-style model's default generation config (no logits processor applies: every one of
_get_logits_processor's, :1420-1660, needs a setting the default leaves unset or do_sample; an
eos_token_id, as LlamaConfig's default 2 and Llama 3's 128001, so that pad_token_id falls back to
it and the EOS criteria run), on a CUDA device (StopCheck, not the mps-only DeferredStopCheck,
:455-468), and no padding (generate drops an all-ones attention mask, :2902-2910, so none is
extended a step). Each loop step, around the forward pass that makes the step's logits:

  before it, prepare_inputs_for_generation:
    input_ids[:, -n:].clone()                               :703-705   1 copy  (b, n)
    position_ids[..., -n:].clone(), unless already n long   :719-724   1 copy  (b, n)
  after it, _update_model_kwargs_for_generation:
    arange(1).view + position_ids[..., -1:] + 1; cat        :1279-1285 4 kernels
  _sample:
    outputs.logits[:, -1].to(copy=True, dtype=float32)      :3251      1 copy  (b, vocab)
    argmax(dim=-1)                                          :3282      1 reduction
    next * unfinished + pad * (1 - unfinished)              :3286      4 kernels
    cat([input_ids, next[:, None]])                         :3289      1 copy  (b, L + 1)
    stopping_criteria (stopping_criteria.py): full(False)   :620, 622  1 + an | per criterion
      MaxLengthCriteria: full((b,), is_done)                :86        1
      EosTokenCriteria: isin(input_ids[:, -1:], eos).any()  :592       3 (isin: fill + compare)
    unfinished & ~done                                      :3291      2 kernels
    StopCheck: bool(unfinished.max() == 0)                  :397       2 kernels, then a copy
                                                                       to the host that waits
                                                                       for the GPU to drain

24 kernels a step (the prefill's 23: its position_ids are the prompt's, uncut). torch.isin is
two CUDA kernels for a test set this small (ATen's TensorCompare.cpp, isin_Tensor_Tensor_out:
out.fill_(invert), then isin_default_kernel's elementwise compare), where a meta capture sees one
op. The stop check's host read (aten._local_scalar_dense, a free op to the kit: no kernel) ends
the step: the host issues nothing more until the GPU has run every kernel before it, which is
what kit.workload.generation's sum of steps assumes, each step starting with the GPU drained.

The ops are recorded as capture records a model's (kit.workload.recorder), in their own class
"generate": HF runs them eagerly, outside any compiled forward, so no compiled chain takes them.
"""
from __future__ import annotations

from dataclasses import replace

import torch

from kit.workload.host_wait import HOST_READ

GENERATE_CLASS = "generate"
EOS_IDS = 1  # Llama's default generation config: one eos_token_id (LlamaConfig, Llama 3 base)
ISIN_CUDA_KERNELS = 2  # fill_ + isin_default_kernel_gpu (ATen TensorCompare.cpp / .cu)


def _record(fn):
    from kit.workload.recorder import Recorder

    with Recorder() as rec:
        fn()
    return rec.nodes


def hf_step_ops(batch: int, length: int, new: int, vocab: int, dtype: torch.dtype) -> tuple[list, list]:
    """(before, after): the Nodes HF 5.25's greedy loop runs around a forward pass of `new`
    tokens per sequence (the prompt's P at the prefill, 1 at a decode step) when input_ids and
    position_ids hold `length` tokens (the prompt and the tokens generated so far), the logits
    (batch, 1, vocab) in the model's `dtype` (logits_to_keep=1, utils.py:2958-2959). Recorded on
    meta tensors; ids are the recorder's own. See the module doc for the lines."""
    meta = "meta"
    ids = torch.zeros(batch, length, dtype=torch.long, device=meta)
    pos = torch.zeros(batch, length, dtype=torch.long, device=meta)  # from the mask's cumsum (:923)

    def before():
        ids[:, -new:].clone(memory_format=torch.contiguous_format)
        if pos.shape[-1] != new:
            pos[..., -new:].clone(memory_format=torch.contiguous_format)

    # made before the loop (the logits by the forward pass): not the step's work
    logits = torch.empty(batch, 1, vocab, dtype=dtype, device=meta)
    pad = torch.zeros((), dtype=torch.long, device=meta)
    eos = torch.zeros(EOS_IDS, dtype=torch.long, device=meta)
    first_unfinished = torch.ones(batch, dtype=torch.long, device=meta)  # :3195

    def after():
        unfinished = first_unfinished
        step = torch.arange(1, dtype=pos.dtype, device=meta).view(1, -1) + pos[..., -1:] + 1
        torch.cat([pos, step], dim=-1)
        scores = logits[:, -1].to(copy=True, dtype=torch.float32)
        tokens = torch.argmax(scores, dim=-1)
        tokens = tokens * unfinished + pad * (1 - unfinished)
        grown = torch.cat([ids, tokens[:, None]], dim=-1)
        done = torch.full((batch,), False, device=meta, dtype=torch.bool)
        done = done | torch.full((batch,), False, device=meta, dtype=torch.bool)
        done = done | torch.isin(grown[:, -1:], eos).any(dim=-1)
        unfinished = unfinished & ~done
        unfinished.max() == 0  # noqa: B015 (StopCheck's bool() of it: the host read, below)

    pre = [replace(n, op_class=GENERATE_CLASS, module="generate") if n.kernels else n
           for n in _record(before)]
    post = []
    for n in _record(after):
        if n.kernels:
            kernels = ISIN_CUDA_KERNELS if n.name() == "isin" else n.kernels
            n = replace(n, op_class=GENERATE_CLASS, module="generate", kernels=kernels)
        post.append(n)
    post.append(replace(post[-1], id=post[-1].id + 1, aten=HOST_READ,
                        op=None, op_class="free", deps=(post[-1].id,), out_bytes=0, kernels=0,
                        shapes="[]", members=(), reads=(), writes=()))
    return pre, post


def with_hf_step(graph, batch: int, length: int, new: int, vocab: int, dtype: torch.dtype):
    """The forward pass's graph with HF's loop ops (hf_step_ops) before and after it, renumbered
    (their dependencies on each other kept; on the forward, dropped: no fusion crosses them), under
    its own cache key. Memoised on the (immutable) graph, as kit.workload.iteration memoises on it."""
    from kit.workload.graph import renumber

    memo = graph.__dict__.setdefault("_with_hf_step", {})
    key = (batch, length, new, vocab, str(dtype))
    if key in memo:
        return memo[key]
    pre, post = hf_step_ops(batch, length, new, vocab, dtype)
    base = len(graph.nodes)
    moved = []
    for shift, nodes in ((base, pre), (base + len(pre) + 1, post)):
        lo = min(n.id for n in nodes)
        moved.append([replace(n, id=n.id - lo + shift, deps=tuple(d - lo + shift for d in n.deps if d >= lo))
                      for n in nodes])
    meta = {"hf_generate_kernels": sum(n.kernels for n in moved[0] + moved[1])}
    if graph.meta.get("cache_key"):
        meta["cache_key"] = f"{graph.meta['cache_key']}:hf-greedy-{length}-{new}"
    memo[key] = renumber(graph, moved[0] + list(graph.nodes) + moved[1], **meta)
    return memo[key]
