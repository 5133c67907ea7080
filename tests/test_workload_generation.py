"""Generation: a prompt's prefill, then decode steps summed over a growing KV cache."""
import json

import numpy as np
import pytest

from kit.api import predict_generation, predict_model
from cli_json import cli_json

from kit.cli import main
from kit.errors import KitError
from kit.workload.generation import (generation, hf_loop, sample_contexts, static_cache_len,
                                     summed_steps_ms)
from kit.workload.iteration import iteration
from kit.workload.models import graph_of

GPT = {"model_type": "gpt2", "n_embd": 64, "n_head": 4, "n_layer": 2, "vocab_size": 100,
       "n_positions": 128, "name": "tiny-gpt"}
GPU = "a100-pcie-40gb"


def test_sample_contexts_cover_every_decode_step():
    assert sample_contexts(100, 1) == []  # one token: the prefill made it
    # the step making new token i (2..N) has P + i - 2 tokens cached before it
    assert sample_contexts(100, 2) == [100]
    c = sample_contexts(100, 257, samples=5)
    assert c[0] == 100 and c[-1] == 355 and len(c) == 5 and c == sorted(set(c))
    assert sample_contexts(10, 4, samples=5) == [10, 11, 12]


def test_the_sum_is_exact_for_a_step_affine_in_its_context():
    prompt, new = 300, 97
    contexts = sample_contexts(prompt, new)
    step = lambda c: 2.5 + 0.01 * c  # noqa: E731
    every = np.arange(prompt, prompt + new - 1)
    assert summed_steps_ms(contexts, [step(c) for c in contexts], prompt, new) == pytest.approx(
        sum(step(c) for c in every))
    assert len(every) == new - 1


@pytest.mark.parametrize("prompt", range(90, 101))
@pytest.mark.parametrize("window", [96, 99])
def test_the_sum_takes_a_sliding_windows_jump_where_it_is(prompt, window):
    """From context w on a full static window shifts each step (a copy of the whole window), so
    the step jumps there; interpolated across the edge from samples far from it, the steps
    between had taken a ramp. With w - 2, w - 1 and w sampled, no step is interpolated across
    the jump, wherever the edge falls among the samples: the sum is exact (w - 2 and w alone had
    priced the step at w - 1 as the mean of its neighbours, off by half the jump)."""
    new, jump = 40, 3.0
    step = lambda c: 2.0 + 0.01 * c + (jump if c >= window else 0.0)  # noqa: E731
    contexts = sample_contexts(prompt, new, windows=[window])
    got = summed_steps_ms(contexts, [step(c) for c in contexts], prompt, new)
    exact = sum(step(c) for c in range(prompt, prompt + new - 1))
    assert got == pytest.approx(exact, abs=1e-9)
    assert sample_contexts(prompt, new, windows=[0]) == sample_contexts(prompt, new)  # 0: none


def test_a_sliding_window_generation_samples_its_edge():
    """A tiny Mistral (window 8, static cache): from context 8 each step adds the window's shift
    (a cat and a copy_ a layer for keys and for values). A 7-token prompt and 20 new tokens had
    sampled contexts 7, 12, 16, 20, 25, so the steps at 8 to 11 were taken on a ramp from 7's
    time; the sum now matches the one over every step. The steps eager (disable_compile): under
    HF's default CUDA graphs this tiny step's kernels are at their floors, the shift unseen."""
    kw = dict(batch=2, prompt=7, new_tokens=20, disable_compile=True)
    r = generation(MISTRAL, GPU, **kw)
    every = generation(MISTRAL, GPU, samples=19, **kw)
    assert [s["context"] for s in every["decode_steps"]] == list(range(7, 26))
    steps = {s["context"]: s["ms"] for s in every["decode_steps"]}
    assert steps[8] > steps[7] and steps[8] == pytest.approx(steps[25], rel=0.01)  # the jump at 8
    assert {7, 8} <= {s["context"] for s in r["decode_steps"]}
    assert r["decode_ms"] == pytest.approx(every["decode_ms"], rel=1e-6)
    assert r["decode_kernel_ms"] == pytest.approx(every["decode_kernel_ms"], rel=1e-6)


@pytest.mark.parametrize("kv_cache", ["static", "dynamic"])
def test_the_step_before_a_windows_edge_is_sampled(kv_cache):
    """A tiny Mistral (window 8), a 4-token prompt and 10 new tokens (contexts 4..12). At
    context 7 = w - 1 the step is neither its left neighbours' (dynamic: the keys reach the
    window, so HF masks it; static: its mask needs no padding) nor the shifting steps' from 8
    on; sampled at 6 and 8 only, it had been priced as their mean (bf16, h100-sxm: static
    19.583 ms against 19.540 over every step, dynamic 17.675 against 17.884). Every step priced
    (samples=9) is the reference. The steps eager (disable_compile), as those figures: under
    HF's default CUDA graphs this tiny step's kernels are at their floors, its edge unseen."""
    mistral = {**MISTRAL, "hidden_size": 32, "intermediate_size": 48, "vocab_size": 50,
               "name": "tiny-mistral-edge"}
    kw = dict(batch=2, prompt=4, new_tokens=10, dtype="bf16", kv_cache=kv_cache,
              disable_compile=True)
    r = generation(mistral, "h100-sxm", **kw)
    every = generation(mistral, "h100-sxm", samples=9, **kw)
    assert [s["context"] for s in every["decode_steps"]] == list(range(4, 13))
    steps = {s["context"]: s["ms"] for s in every["decode_steps"]}
    assert steps[7] != pytest.approx((steps[6] + steps[8]) / 2, rel=1e-3)  # w - 1: no mean
    assert 7 in {s["context"] for s in r["decode_steps"]}
    assert r["decode_ms"] == pytest.approx(every["decode_ms"], rel=1e-9)
    assert r["decode_kernel_ms"] == pytest.approx(every["decode_kernel_ms"], rel=1e-9)


def test_fewer_than_two_decode_samples_are_refused():
    """One sample had priced every step as the first (a step over the whole answer's growing
    cache at the prompt's context); none had been numpy's traceback."""
    for samples in (0, 1, 2.5):
        with pytest.raises(KitError, match="generation: samples must be a whole number of at least 2"):
            generation(GPT, GPU, batch=1, prompt=8, new_tokens=4, samples=samples)


def test_generation_is_its_prefill_and_its_decode_steps():
    b, p, n = 2, 20, 6
    # each pass eager, as asked: HF's generate with disable_compile=True (its default compiles
    # the decode steps, tests/test_generate_hf_auto_compile.py)
    r = predict_generation(GPT, GPU, batch=b, prompt=p, new_tokens=n, disable_compile=True)
    # the prefill computes the last position's logits only: less than a full forward pass
    # each pass with the ops HF's greedy loop runs around it (tests/test_hf_generate_loop.py)
    looped = hf_loop(GPT, b)
    cap = p + n - 1  # the static cache generate preallocates (max_length - 1), GPT-2's too
    # its prefill HF 5.25's, the cache written inside each layer (tests/test_generate_prefill_hf5.py)
    last = iteration(looped(graph_of(GPT, b, p, "inference", "fp32", last_logits=True,
                                     cache_len=cap), p, p), GPU)
    assert r["ttft_ms"] == pytest.approx(last.total_ms)

    def step_ms(c):
        return iteration(looped(graph_of(GPT, b, c, "decode", "fp32", cache_len=cap), c + 1, 1),
                         GPU).total_ms

    prefill = graph_of(GPT, b, p, "inference", "fp32", last_logits=True)
    head = [n.op for n in prefill if n.module == "lm_head" and n.op is not None]
    assert [op.m for op in head] == [b]  # one row a sequence (a full pass: b * p rows)
    for s in r["decode_steps"]:
        assert s["ms"] == pytest.approx(step_ms(s["context"]))
        assert s["ms"] > predict_model(GPT, GPU, "decode", b, s["context"]).total_ms
    # every context sampled (5 samples, 5 steps): the sum is the steps' own sum
    direct = sum(step_ms(c) for c in range(p, p + n - 1))
    assert r["decode_ms"] == pytest.approx(direct)
    assert r["total_ms"] == pytest.approx(r["ttft_ms"] + direct)
    assert r["tpot_ms"] == pytest.approx(direct / (n - 1))
    assert r["tokens_per_s"] == pytest.approx(b * n / r["total_ms"] * 1e3)
    # the memory holds the cache at its longest: p + n - 1 tokens (the last new one is never fed)
    assert r["memory"]["kv_cache_bytes"] == 2 * 2 * b * 4 * (p + n - 1) * 16 * 4
    one = generation(GPT, GPU, batch=b, prompt=p, new_tokens=1)
    assert one["total_ms"] == pytest.approx(one["ttft_ms"]) and one["tpot_ms"] is None
    # the prompt's cache, which the prefill wrote, is in the memory need (it was left out)
    assert one["memory"]["kv_cache_bytes"] == 2 * 2 * b * 4 * p * 16 * 4


MISTRAL = {"model_type": "mistral", "hidden_size": 64, "num_attention_heads": 4,
           "num_key_value_heads": 2, "num_hidden_layers": 2, "intermediate_size": 128,
           "vocab_size": 100, "sliding_window": 8, "name": "tiny-mistral"}


# a layer's prefill writes of its keys and values: a static cache's index_copy_ (or copy_ of a
# window the prompt overfills), a dynamic one's cat onto its empty tensor
WRITES = ("aten.index_copy_.default", "aten.copy_.default")


def _writes(g):
    return [n for n in g.nodes if n.aten in WRITES or n.shapes.startswith("[0]x")]


@pytest.mark.parametrize("cfg,kind", [(GPT, "static"), (GPT, "dynamic"), (MISTRAL, "static"),
                                      (MISTRAL, "dynamic")])
def test_the_prefill_writes_the_prompts_keys_and_values_into_the_cache(cfg, kind):
    """The decode steps read the prompt's keys and values from the cache, so the prefill writes
    them there, once a layer each, inside the layer (tests/test_generate_prefill_hf5.py for
    where and what else): P rows (a static window the prompt overfills: its last `window`,
    StaticSlidingWindowLayer; a dynamic cache copies the whole prompt, a sliding one too before
    it keeps the last window - 1 rows as a view, DynamicSlidingWindowLayer), read from the
    projection and written. The prefill had once written none, its time to first token that of
    the bare forward pass."""
    b, p = 2, 20
    bare = graph_of(cfg, b, p, "inference", "fp32", last_logits=True)
    cap = static_cache_len(cfg, p, 3, kind)
    prefill = graph_of(cfg, b, p, "inference", "fp32", last_logits=True, kv_cache=kind,
                       cache_len=cap)
    writes = _writes(prefill)
    layers = cfg.get("n_layer") or cfg["num_hidden_layers"]
    assert [n.layer for n in writes] == [i for i in range(layers) for _ in (0, 1)]
    assert not _writes(bare)
    heads = cfg.get("num_key_value_heads") or cfg["n_head"]
    d = (cfg.get("n_embd") or cfg["hidden_size"]) // (cfg.get("n_head") or cfg["num_attention_heads"])
    w = cfg.get("sliding_window")
    rows = min(p, w) if w and kind == "static" else p
    one = b * heads * rows * d * 4  # one layer's keys (or values) of the prompt, fp32
    for n in writes:  # read and written once (an index_copy_ also reads its positions)
        assert 2 * one <= n.op.bytes <= 2 * (one + 8 * rows), (n.aten, n.op.bytes, one)
    r = generation(cfg, GPU, batch=b, prompt=p, new_tokens=3, kv_cache=kind)
    assert r["ttft_ms"] > iteration(bare, GPU).total_ms
    # with HF's greedy loop ops around it (tests/test_hf_generate_loop.py)
    assert r["ttft_ms"] == pytest.approx(iteration(hf_loop(cfg, b)(prefill, p, p), GPU).total_ms)


def test_longer_prompts_cost_more_first_token_and_longer_answers_more_decode():
    short = generation("gpt2", GPU, batch=4, prompt=128, new_tokens=32)
    long_prompt = generation("gpt2", GPU, batch=4, prompt=512, new_tokens=32)
    long_answer = generation("gpt2", GPU, batch=4, prompt=128, new_tokens=128)
    assert long_prompt["ttft_ms"] > short["ttft_ms"]
    # the same prompt; the prefill zero-fills a longer preallocated cache (HF 5.25's StaticLayer.
    # lazy_initialization, cache_utils.py:440-449): 255 rows a layer against 159, a few us more
    assert short["ttft_ms"] < long_answer["ttft_ms"] < 1.01 * short["ttft_ms"]
    assert long_answer["decode_ms"] > 3 * short["decode_ms"]  # 127 steps against 31


def test_bad_generation_requests_are_one_clear_error():
    with pytest.raises(KitError, match="decoder-only"):
        generation("bert-base", GPU)
    with pytest.raises(KitError, match="1000-token prompt and 100 new tokens need 1099 positions"):
        generation("gpt2", GPU, prompt=1000, new_tokens=100)
    # P + N - 1 positions: 1000 + 25 fits gpt2's 1024 (it was refused one token early)
    assert generation("gpt2", GPU, prompt=1000, new_tokens=25)["new_tokens"] == 25
    with pytest.raises(KitError, match="generation: new_tokens must be a whole number of at least 1, got 0"):
        generation("gpt2", GPU, new_tokens=0)
    with pytest.raises(KitError, match="cannot import module 'mypkg'"):  # a callable's config
        generation("mypkg:make", GPU)  # would do: it is looked for first
    import torch

    with pytest.raises(KitError, match="zoo decoder or an HF-style config"):
        generation(torch.nn.Linear(4, 4), GPU)  # a module: no prefill-and-decode pair
    with pytest.raises(KitError, match="predict_generation"):
        predict_model("gpt2", GPU, mode="generate")


def test_a_config_file_given_as_a_path_generates(tmp_path):
    """predict_model takes a config file as a pathlib.Path; predict_generation had refused one as
    "a Python module", with a message that asked for a file."""
    path = tmp_path / "tiny.json"
    path.write_text(json.dumps(GPT))
    r = predict_generation(path, GPU, batch=1, prompt=16, new_tokens=4)
    assert r["total_ms"] == pytest.approx(predict_generation(str(path), GPU, batch=1, prompt=16,
                                                             new_tokens=4)["total_ms"])
    assert r["model"] == GPT["name"]


def test_a_config_file_generates(tmp_path):
    path = tmp_path / "tiny.json"
    path.write_text(json.dumps(GPT))
    r = generation(str(path), GPU, batch=1, prompt=16, new_tokens=4)
    assert r["model"] == "tiny-gpt" and r["new_tokens"] == 4 and r["tpot_ms"] > 0


def test_cli_generate(capsys):
    r = cli_json(capsys, ["predict", "gpt2", "--gpu", GPU, "--mode", "generate", "--batch", "2",
                       "--seq", "64", "--new-tokens", "16"])
    assert r["mode"] == "generate" and r["prompt"] == 64 and r["new_tokens"] == 16
    assert r["total_ms"] == pytest.approx(r["ttft_ms"] + r["decode_ms"])
    c = cli_json(capsys, ["compare", "gpt2", "--gpus", f"{GPU},t4", "--mode", "generate", "--batch",
                       "2", "--seq", "64", "--new-tokens", "16"])
    assert c["unit"] == "tokens" and [row["gpu"] for row in c["rows"]] == [GPU, "t4"]
    for row in c["rows"]:
        assert row["tokens_per_s"] == pytest.approx(2 * 16 / row["step_ms"] * 1e3)
        assert row["step_ms"] == pytest.approx(row["ttft_ms"] + 15 * row["tpot_ms"])
        assert row["fits"] and row["max_batch"] >= 2
    assert main(["predict", "gpt2", "--gpu", GPU, "--mode", "generate", "--seq", "64"]) == 0
    assert "TTFT" in capsys.readouterr().out
    assert main(["predict", "gpt2", "--gpu", GPU, "--mode", "generate", "--trace", "t.json"]) == 2
    assert "--trace shows one step" in capsys.readouterr().err
    assert main(["predict", "gpt2", "--gpu", GPU, "--new-tokens", "4"]) == 2
    assert "--new-tokens goes with --mode generate" in capsys.readouterr().err


@pytest.mark.parametrize("new_tokens", [1, 16])
def test_compare_generate_text_shows_each_rows_ttft_and_tpot(capsys, new_tokens):
    """kit compare --mode generate's JSON rows hold ttft_ms and tpot_ms; its text table had said
    only the whole answer's time, so the two numbers a generation is read by were in one output
    and not the other."""
    argv = ["compare", "gpt2", "--gpus", f"{GPU},t4", "--mode", "generate", "--batch", "2",
            "--seq", "64", "--new-tokens", str(new_tokens)]
    c = cli_json(capsys, argv)
    assert main(argv) == 0
    lines = capsys.readouterr().out.splitlines()
    for row in c["rows"]:
        line = next(x for x in lines if x.startswith(row["gpu"] + " "))
        tpot = "-" if row["tpot_ms"] is None else f"{row['tpot_ms']:.2f} ms"
        assert f"TTFT {row['ttft_ms']:.2f} ms, TPOT {tpot}" in line, line
        assert (row["tpot_ms"] is None) == (new_tokens == 1)
    assert main(argv[:5] + ["decode", "--seq", "64"]) == 0  # the other modes' rows have neither
    assert "TTFT" not in capsys.readouterr().out


def test_generate_memory_counts_the_last_positions_logits_only():
    # the prefill's activations held every prompt position's logits (b x p x vocab), so generate's
    # memory need was several times decode's at the same context and its max batch far smaller
    big = {**GPT, "vocab_size": 32000}
    full = graph_of(big, 8, 64, "inference", "fp32")
    last = graph_of(big, 8, 64, "inference", "fp32", last_logits=True)
    assert full.meta["activation_bytes"] >= 2 * 8 * 64 * 32000 * 4
    assert last.meta["activation_bytes"] < full.meta["activation_bytes"] / 8
    r = generation(big, GPU, batch=8, prompt=64, new_tokens=8)
    assert r["memory"]["activations_bytes"] < full.meta["activation_bytes"] / 8


def test_cuda_graphs_refuse_a_dynamic_cache(capsys):
    # it was accepted and predicted a replayed step for a cache that is reallocated every step
    assert main(["predict", "gpt2", "--gpu", GPU, "--mode", "decode", "--seq", "64",
                 "--kv-cache", "dynamic", "--cuda-graphs"]) == 2
    assert "--kv-cache static" in capsys.readouterr().err
    assert main(["predict", "gpt2", "--gpu", GPU, "--mode", "decode", "--seq", "64", "--cuda-graphs"]) == 0


def test_every_costing_module_the_latency_cache_names_exists_and_stamps_it(tmp_path, monkeypatch):
    """The latency cache's key changes when a module that turns a graph into the ops it prices
    changes. generation.py appends the prefill's KV-cache writes under their own key and had
    been missing: a change to how many rows they write would have kept stale predictions."""
    import shutil

    from kit.workload import latency_cache

    assert all((latency_cache.HERE / n).is_file() for n in latency_cache.COSTING_FILES)
    copy = tmp_path / "workload"
    shutil.copytree(latency_cache.HERE, copy)
    monkeypatch.setattr(latency_cache, "HERE", copy)
    before = latency_cache._predictor_stamp()
    f = copy / "generation.py"
    f.write_text(f.read_text() + "\n# changed\n")
    import time

    from kit import source_digest

    monkeypatch.setattr(source_digest, "_FIRST", {})  # a process started after the change
    monkeypatch.setattr(source_digest, "_STARTED_NS", time.time_ns())
    after = latency_cache._predictor_stamp()
    assert after is not None and after != before  # (None would have passed !=)


def test_the_latency_cache_key_follows_contents_not_mtimes(tmp_path, monkeypatch):
    """An edit that keeps a costing module's size and mtime (a copy with its mtime kept, an edit
    within the clock's tick) changes the latency cache's key: it had been the files' names,
    sizes and mtimes, and served the other code's latencies."""
    import os
    import shutil

    from kit.workload import latency_cache

    copy = tmp_path / "workload"
    shutil.copytree(latency_cache.HERE, copy)
    monkeypatch.setattr(latency_cache, "HERE", copy)
    before = latency_cache._predictor_stamp()
    f = copy / "kernels.py"
    st, text = f.stat(), f.read_text()
    f.write_text(text.replace("(", "[", 1))  # same size
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert f.stat().st_size == st.st_size and f.stat().st_mtime_ns == st.st_mtime_ns
    import time

    from kit import source_digest

    monkeypatch.setattr(source_digest, "_MEMO", {})  # another process: nothing memoised
    monkeypatch.setattr(source_digest, "_FIRST", {})
    monkeypatch.setattr(source_digest, "_STARTED_NS", time.time_ns())
    after = latency_cache._predictor_stamp()
    assert after is not None and after != before  # (None would have passed !=)
