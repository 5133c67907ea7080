"""Generating text: a prompt's prefill, then one decode step per new token.

    r = generation(model, gpu, batch=8, prompt=1024, new_tokens=256, dtype="bf16")

A decoder answers a prompt of P tokens by running one forward pass over them (the prefill,
`mode="inference"`, as HF 5.25's generate runs it (below): with the cache, static
or dynamic, its writes inside each layer; computing the logits of each
sequence's last position only, as HF generate and serving engines do), which also yields the
first new token: the time to first token (TTFT).
Each further token is one decode step (`mode="decode"`, kit.workload.kv_cache): the step that
makes the i-th new token (i = 2..N) feeds the (i-1)-th with P + i - 2 tokens already cached. The
last new token is never fed back, so the whole generation needs P + N - 1 positions, which a
static cache holds from the start: HF's generate preallocates its StaticCache for them, and every
step attends over (and masks) the whole of it (static_cache_len, kit.workload.hf_masks).

    TTFT  = prefill(P), its writes of the prompt's keys and values into the cache included
    total = TTFT + sum_{c = P}^{P+N-2} decode(c)
    TPOT  = (total - TTFT) / (N - 1)              (time per output token after the first)

A decode step's time is its weights (the same at every context) plus attention over the cache
(growing with it), so the sum is taken from decode steps predicted at `samples` contexts spread
over the contexts [P, P+N-2] (first and last included; each a step's tokens cached before it),
with both sides of a sliding window's edge among them (sample_contexts), and linear
interpolation between them: exact for a step that is affine in its context between samples,
and each sample is a full capture and prediction. The steps'
GPU work (their kernels, without the time the GPU waits on the CPU) is summed the same way
(`decode_kernel_ms`).

Every pass, the prefill's and each decode step's, is priced with the GPU work HF 5.25's greedy
generate() runs around the forward pass, outside the model (kit.workload.hf_generate: input
slices, position ids, the logits' FP32 copy, argmax, the stopping criteria; 24 kernels and their
launches a decode step, 23 in the prefill). It had priced the forward passes alone: llama3-8b,
batch 1, a 1,024-token prompt and 256 new tokens, bf16 on an h100-sxm, TTFT 30.99 -> 31.05 ms,
TPOT 26.84 -> 26.92 ms, 6,876.0 -> 6,896.6 ms in all (26.83 and 6,871.8 since the decode mask
leaves out the 2D mask generate drops, kit.workload.hf_masks). Each step ends at HF's stop check, whose
host read waits for the GPU to drain, so a step starts with the GPU idle, as the sum takes it.

Over a static cache, the decode steps are priced as HF 5.25's generate runs them by default on a
CUDA GPU: compiled (the kit's compiled fusion, kit.workload.fusion) and replayed as a CUDA graph
(kit.workload.iteration.CUDA_GRAPH, as `kit predict --cuda-graphs`), HF's loop ops around the
forward eager (hf_auto_compiles); the prefill, which HF never compiles, as fusion and overhead
ask (eager by default). disable_compile=True (HF's GenerationConfig flag of that name; CLI
--disable-compile) prices the decode steps as asked too. A dynamic cache is never compiled.
Each result says how each pass was priced ("priced"). Compiling and recording the graph, before
the first step of a call with a new batch or cache length, is not priced; nor does a host cost
calibrated from a trace (overhead) reach the compiled steps, whose loop ops take eager defaults.

How each decoder's prefill runs (every zoo decoder, kit.workload.modes.decodes; a config of no
model_type with n_embd is a GPT-2), each layer initialising its cache layer and writing the
prompt's rows before its attention, which SDPA runs is_causal, unmasked: over a static cache
(zoo._capture's "inference:<cache_len>") the first P rows of the preallocated cache its update
returns (sdpa_attention_forward cuts them, kit.workload.hf_masks.causal_prefill_keys), the cache
initialised with zeros and a blocking copy of cumulative_length to the device
(kit.workload.kv_cache.hf_prefill_update); over a dynamic one ("inference:dynamic") the prompt's
P rows, concatenated onto empty tensors (kv_cache.hf_dynamic_init), so square: the flash kernel.
A sliding layer's cache (StaticSlidingWindowLayer, DynamicSlidingWindowLayer) initialises and
writes as kv_cache.cache_update runs it, its mask as hf_masks.decode_mask builds it for a prefill.
Eager Gemma 2 and GPT-OSS attend over every key their cache layers return
(eager_attention_forward cuts none: a static full layer's whole preallocated cache), under
eager_mask's additive mask, never skipped. DeepSeek-V3 caches its latents, then expands all the
cache returns (kit.workload.zoo_deepseek).
"""
from __future__ import annotations

import os

import numpy as np

from kit.errors import KitError, whole_number
from kit.workload.inductor import check_fusion_on, inductor_refusal

DECODE_SAMPLES = 5


def sample_contexts(prompt: int, new_tokens: int, samples: int = DECODE_SAMPLES,
                    windows=()) -> list[int]:
    """The contexts at which decode steps are predicted: up to `samples`, evenly spread over
    the N - 1 decode steps' contexts P .. P+N-2 (the tokens cached before each), ends included,
    and w - 2, w - 1 and w for each sliding window w inside them, where the step is not affine in
    its context (kit.workload.kv_cache, kit.workload.hf_masks). A dynamic window's step grows
    with its context up to w - 2; from w - 1 its keys reach the window, so HF masks it (no
    flash kernel), and it stays flat; a static window (generation's, preallocated for the whole answer) holds min(w, cache)
    rows from the start, so its step is flat up to w - 1 and shifts the full window, a copy of
    it every step and layer, from w on. Sampling only w - 2 and w had priced the step at w - 1 as
    the mean of its neighbours (a tiny Mistral, window 8, a 4-token prompt and 10 new tokens,
    bf16 on an h100-sxm: 19.583 ms of decode against 19.540 over every step, static; 17.675
    against 17.884, dynamic; with w - 1 sampled both are exact). gemma2-9b (window 4,096),
    batch 16, a 3,906-token prompt and 256 new tokens, static: 104.19 ms a step up to context
    4,094, 104.17 at 4,095 (its window's mask needs no padding), 128.89 from 4,096; the decode
    sums to 28,173.5 ms against 28,173.6 over every step, where w - 2 and w alone gave 28,185.9
    (the step at 4,095 priced at 116.54)."""
    if new_tokens < 2:
        return []
    lo, hi = prompt, prompt + new_tokens - 2
    spread = {int(round(c)) for c in np.linspace(lo, hi, min(samples, hi - lo + 1))}
    edges = {c for w in windows if w for c in (w - 2, w - 1, w) if lo <= c <= hi}
    return sorted(spread | edges)


def sliding_windows_of(model) -> list[int]:
    """The distinct sliding windows of a zoo decoder or config's layers (none for a model
    without: GPT-2, OPT, DeepSeek, Llama)."""
    from kit.workload import zoo
    from kit.workload.modes import LLAMA_FAMILIES
    from kit.workload.zoo_modern import sliding_windows

    cfg = zoo.config(model) if isinstance(model, str) else dict(model)
    if cfg.get("model_type") not in LLAMA_FAMILIES:
        return []
    return sorted({w for w in sliding_windows(cfg) if w})


def static_cache_len(model, prompt: int, new_tokens: int, kv_cache: str) -> int | None:
    """The length HF's generate preallocates a static cache for: max_cache_len = max_length - 1
    = prompt + new tokens - 1 (transformers 5.25 generation/utils.py:2039, 2966), every decode
    step's attention reading all of it under a mask (kit.workload.hf_masks). None for a dynamic
    cache. Every zoo decoder: HF 5.25's GPT-2, OPT and DeepSeek-V3 preallocate and mask theirs
    as the Llama-style ones (modeling_gpt2.py:583, modeling_opt.py:363, modeling_deepseek_v3.py:
    593 call create_causal_mask), where the zoo had given them a cache of the step's context + 1,
    read unmasked."""
    if kv_cache != "static":
        return None
    return prompt + new_tokens - 1


def hf_auto_compiles(kv_cache: str, disable_compile: bool = False) -> bool:
    """Whether HF 5.25's generate compiles the decode steps' forward, as it decides on a CUDA GPU
    (every GPU the kit prices; ROCm's torch device is "cuda" too) with no quantizer or offload
    (neither modelled): _valid_auto_compile_criteria (generation/utils.py:2438-2498), used by
    _sample at :3204-3208, holds when disable_compile is unset and the cache is compileable and no
    DynamicCache (StaticLayer and its sliding subclass is_compileable = True, cache_utils.py:413;
    DynamicLayer False). get_compiled_call compiles with CompileConfig() (modeling_utils.py:
    4876-4904): inductor, mode reduce-overhead (CUDA graphs), fullgraph False, dynamic None
    (configuration_utils.py:1677-1680). Over a static cache every decode step's tensors keep
    their shapes (the cache preallocated; the tokens cached a tensor, cumulative_length,
    cache_utils.py:422, marked a static address, :458, updated in place, :483, and read by
    get_seq_length, :502-504; the mask sized to the whole cache by get_mask_sizes, :496-500): one
    graph, no recompile as the context grows, so dynamic None (automatic dynamic shapes, acting
    only at a recompile) never applies. Not priced: a sliding layer (StaticSlidingWindowLayer)
    keeps a Python int length (cumulative_length_int, :543), on which dynamo may guard and
    recompile; every pass is priced as one graph. The prefill is
    called uncompiled (_prefill: self(...), generation/utils.py:4346)."""
    return kv_cache == "static" and not disable_compile


COMPILE_NOT_PRICED = (
    "compiling the decode steps and recording their CUDA graph, before the first step of a "
    "generate call whose batch or cache length the model has not yet compiled for, is not priced")


def compile_refusal(g) -> str | None:
    """Why HF's default (compiled) generate cannot run on GPU g, or None where it can: on a GPU
    Inductor cannot compile for (kit.workload.inductor), HF 5.25's generate over a static cache
    fails at its first decode step, so it has no time (kit compare shows such a GPU's row as
    unsupported, with this)."""
    return inductor_refusal(g, "HF 5.25's generate compiles a static cache's decode steps",
                            "price HF's generate(disable_compile=True) (--disable-compile) or a "
                            "dynamic cache (--kv-cache dynamic)")


def check_compiles_on(g) -> None:
    """Refuse HF's default (compiled) generate on a GPU Inductor cannot compile for
    (compile_refusal)."""
    why = compile_refusal(g)
    if why:
        raise KitError(why)


def pass_pricing(fusion: str, overhead, why: str) -> dict:
    """How a pass was priced, as a generate result says it: its fusion, whether it replays a CUDA
    graph (kit.workload.iteration.CUDA_GRAPH), and why."""
    from kit.workload.iteration import CUDA_GRAPH

    return {"fusion": fusion, "cuda_graphs": overhead == CUDA_GRAPH, "why": why}


def pricing(fusion: str, overhead, kv_cache: str, disable_compile: bool) -> dict:
    """{"prefill": ..., "decode": ...}: each pass's fusion and overhead (the decode steps' compiled
    under CUDA graphs where HF auto-compiles them, hf_auto_compiles) and pass_pricing's account."""
    from kit.workload.iteration import CUDA_GRAPH

    prefill = pass_pricing(fusion, overhead, "as asked; HF's generate never compiles the prefill")
    if hf_auto_compiles(kv_cache, disable_compile):
        return {"prefill": prefill, "decode": pass_pricing(
            "compiled", CUDA_GRAPH, "HF 5.25's generate compiles a static cache's decode steps by "
            "default: torch.compile, inductor, mode reduce-overhead; disable_compile=True prices "
            "them as asked")}
    why = ("as asked: disable_compile=True" if kv_cache == "static"
           else "as asked; HF's generate never compiles a dynamic cache's steps")
    return {"prefill": prefill, "decode": pass_pricing(fusion, overhead, why)}


def summed_steps_ms(contexts: list[int], step_ms: list[float], prompt: int, new_tokens: int) -> float:
    """Sum over every decode context P..P+N-2 of the step time interpolated between samples."""
    if new_tokens < 2:
        return 0.0
    every = np.arange(prompt, prompt + new_tokens - 1, dtype=float)
    return float(np.interp(every, np.asarray(contexts, float), np.asarray(step_ms, float)).sum())


def hf_loop(model, batch: int):
    """f(graph, length, new): a forward pass's graph with the ops HF 5.25's greedy generate runs
    around it (kit.workload.hf_generate.with_hf_step) while input_ids hold `length` tokens and the
    pass reads `new` of them, its logits in the graph's dtype over the model's vocabulary."""
    from kit.workload import zoo
    from kit.workload.capture import TORCH_DTYPES
    from kit.workload.hf_generate import with_hf_step

    vocab = (zoo.config(model) if isinstance(model, str) else dict(model)).get("vocab_size")
    if not vocab:
        raise KitError("generation needs the model's vocab_size (its config has none): HF's "
                       "generate reads every step's logits over it")

    def looped(graph, length: int, new: int):
        import torch

        dtype = TORCH_DTYPES.get(graph.meta.get("dtype")) or torch.float32
        return with_hf_step(graph, batch, length, new, int(vocab), dtype)
    return looped


def generation(model, gpu, batch: int = 1, prompt: int = 512, new_tokens: int = 128,
               dtype: str = "fp32", fusion: str = "eager", predictor: str = "auto", overhead=None,
               samples: int = DECODE_SAMPLES, kv_cache: str = "static",
               disable_compile: bool = False) -> dict:
    """Predict generating `new_tokens` per sequence after a `prompt`-token prefill (module doc).
    model: a zoo decoder or an HF-style config of one (kit.workload.zoo.DECODERS).
    disable_compile: HF's flag; False (HF's default): a static cache's decode steps compiled
    under CUDA graphs, whatever fusion and overhead ask; True: as they ask (hf_auto_compiles)."""
    from kit.hardware import get_gpu
    from kit.workload import zoo
    from kit.workload.fusion import check_fusion
    from kit.workload.iteration import CUDA_GRAPH, iteration
    from kit.workload.models import gpu_memory, graph_of, memory_bytes, read_config

    batch, prompt, new_tokens = (whole_number(v, f"generation: {name}") for name, v in (
        ("batch", batch), ("prompt", prompt), ("new_tokens", new_tokens)))  # numpy integers too
    # the first and last step at least: one sample had priced every step as the first (0: an
    # interpolation over no points, a numpy traceback)
    samples = whole_number(samples, "generation: samples", low=2)
    if isinstance(model, os.PathLike):  # a config file as a Path, as graph_of takes it (it had
        model = os.fspath(model)  # been refused as "a Python module", its own file named)
    if isinstance(model, str) and model.lower().endswith(".json"):
        model = read_config(model)
    elif isinstance(model, str) and ":" in model and "=" not in model:  # a callable's config dict
        from kit.workload.models import built_model

        made = built_model(model)
        if isinstance(made, dict):  # named after the callable, unless it names itself
            model = {"name": model, **made}
    if not isinstance(model, (str, dict)) or (isinstance(model, str) and ":" in model):
        raise KitError("generation needs a zoo decoder or an HF-style config (from a file, a dict, "
                       "or a callable returning one; a Python module has no prefill-and-decode "
                       "pair the kit can build); use mode decode for one step of a module with "
                       "decode_inputs")
    if not zoo.decodes(model):
        name = zoo.resolve(model) if isinstance(model, str) else model.get("name", model.get("model_type"))
        raise KitError(f"mode generate needs a decoder-only model ({', '.join(zoo.DECODERS)}); "
                       f"{name} is not one")
    zoo.check_mode(model, "decode", None, kv_cache)
    limit = zoo.max_seq(model)  # P + N - 1 positions: the last new token is never fed back
    if limit and prompt + new_tokens - 1 > limit:
        name = zoo.resolve(model) if isinstance(model, str) else model.get("name", model.get("model_type"))
        if new_tokens > limit:  # no prompt helps: the new tokens alone take every position
            raise KitError(f"{new_tokens} new tokens alone need more than {name}'s {limit} learned "
                           f"positions, whatever the prompt; generate at most {limit} (--new-tokens)")
        raise KitError(f"a {prompt}-token prompt and {new_tokens} new tokens need "
                       f"{prompt + new_tokens - 1} positions (the last new token is never fed back), "
                       f"more than {name}'s {limit}; give a seq of {limit - new_tokens + 1} or less "
                       "(--seq) or fewer new tokens (--new-tokens)")
    check_fusion(fusion)  # before the captures; iteration() memoises on it as a dict key
    if not isinstance(disable_compile, (bool, np.bool_)):  # "no" or 0 would read as a choice
        raise KitError(f"generation: disable_compile must be True or False, got {disable_compile!r}")
    run = dict(predictor=predictor, fusion=fusion, overhead=overhead)
    by_hf = hf_auto_compiles(kv_cache, bool(disable_compile))  # compiled, under CUDA graphs
    priced = pricing(fusion, overhead, kv_cache, bool(disable_compile))
    step_run = dict(run, fusion="compiled", overhead=CUDA_GRAPH) if by_hf else run
    g = get_gpu(gpu)
    if by_hf:
        check_compiles_on(g)
    check_fusion_on(g, fusion)  # the prefill (and, HF not compiling, the steps) as asked
    cache_len = static_cache_len(model, prompt, new_tokens, kv_cache)
    # generate's prefill, its cache's writes inside each layer, into either cache (module doc)
    prefill_graph = graph_of(model, batch, prompt, "inference", dtype, last_logits=True,
                             kv_cache=kv_cache, cache_len=cache_len)
    looped = hf_loop(model, batch)  # HF's greedy loop around each forward (kit.workload.hf_generate)
    prefill = iteration(looped(prefill_graph, prompt, prompt), gpu, **run)
    contexts = sample_contexts(prompt, new_tokens, samples, sliding_windows_of(model))
    # the step that feeds the token at position c: input_ids hold c + 1 tokens
    steps = [iteration(looped(graph_of(model, batch, c, "decode", dtype, kv_cache=kv_cache,
                                       cache_len=cache_len), c + 1, 1), gpu, **step_run)
             for c in contexts]
    step_ms = [s.total_ms for s in steps]
    decode_ms = summed_steps_ms(contexts, step_ms, prompt, new_tokens)
    decode_kernel_ms = summed_steps_ms(contexts, [s.kernel_ms for s in steps], prompt, new_tokens)
    band = [summed_steps_ms(contexts, [getattr(s, f"total_{q}_ms") for s in steps], prompt,
                            new_tokens) for q in ("p10", "p90")]
    total = prefill.total_ms + decode_ms
    mem = memory_bytes(prefill)
    # the cache at its longest (P + N - 1 tokens; after a lone new token, the prompt's P, which
    # the prefill wrote), and the larger of the two passes' activations
    cached = prompt + new_tokens - 2 if new_tokens > 1 else prompt - 1
    if cached >= 1:
        last = memory_bytes(graph_of(model, batch, cached, "decode", dtype, kv_cache=kv_cache,
                                     cache_len=cache_len))
        acts = max(mem["activations_bytes"], last["activations_bytes"])
        mem = {**last, "activations_bytes": acts,
               "total_bytes": last["total_bytes"] - last["activations_bytes"] + acts}
    return {"model": prefill.model, "gpu": g.key, "mode": "generate", "batch": batch,
            "prompt": prompt, "new_tokens": new_tokens,
            # model: the dtype the model holds (a zoo decoder or config: fp32), and in which
            "dtype": prefill.meta.get("dtype", dtype) if dtype == "model" else dtype,
            **({"model_dtypes": prefill.meta["model_dtypes"]} if "model_dtypes" in prefill.meta else {}),
            "fusion": fusion,
            "kv_cache": kv_cache,
            "disable_compile": bool(disable_compile), "priced": priced,
            # the compile and the graph's recording, once before the first step: not priced
            "notes": [COMPILE_NOT_PRICED] if by_hf else [],
            "predictor": prefill.predictor, "ttft_ms": prefill.total_ms,
            "ttft_band_ms": [prefill.total_p10_ms, prefill.total_p90_ms],
            "tpot_ms": decode_ms / (new_tokens - 1) if new_tokens > 1 else None,
            "decode_ms": decode_ms, "decode_kernel_ms": decode_kernel_ms, "decode_band_ms": band,
            "total_ms": total,
            "tokens_per_s": batch * new_tokens / total * 1e3,
            "decode_steps": [{"context": c, "ms": s.total_ms, "kernel_ms": s.kernel_ms,
                              "gpu_idle_ms": max(s.gpu_idle_ms, 0.0)} for c, s in zip(contexts, steps)],
            "prefill": {"ms": prefill.total_ms, "kernel_ms": prefill.kernel_ms,
                        "gpu_idle_ms": max(prefill.gpu_idle_ms, 0.0),
                        "by_class": prefill.by_class().to_dict("records")},
            "memory": {**mem, **gpu_memory(g, mem)}}
