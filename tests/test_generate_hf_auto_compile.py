"""Generate prices a static cache's decode steps as HF 5.25's generate runs them by default.

transformers 5.25's _sample calls model_forward = self.get_compiled_call(compile_config) when
self._valid_auto_compile_criteria(...) holds (generation/utils.py:3204-3208). The criteria
(:2438-2498): generation_config.disable_compile unset, a CUDA device, a cache that is_compileable
and is no DynamicCache (StaticLayer.is_compileable = True, cache_utils.py:413; the base layer's
False, :26), no quantizer or offload. get_compiled_call compiles with CompileConfig() when none is
given (modeling_utils.py:4876-4904), whose defaults are backend "inductor", mode
"reduce-overhead" (CUDA graphs), fullgraph False, dynamic None (configuration_utils.py:1677-1680).
The prefill is called uncompiled (_prefill returns self(**model_inputs), :4346). So: a static
cache's decode steps compiled and replayed as CUDA graphs, the prefill as asked, a dynamic cache
never compiled, and disable_compile=True every pass as asked. The kit's own pricing of a compiled
CUDA-graph step is iteration(..., fusion="compiled", overhead=CUDA_GRAPH), what `kit predict
--fusion compiled --cuda-graphs` runs.
"""
import json

import pytest

from cli_json import cli_json

from kit.cli import main
from kit.errors import KitError
from kit.workload.generation import COMPILE_NOT_PRICED, generation, hf_auto_compiles, hf_loop
from kit.workload.iteration import CUDA_GRAPH, iteration
from kit.workload.models import graph_of

GPT = {"model_type": "gpt2", "n_embd": 64, "n_head": 4, "n_layer": 2, "vocab_size": 100,
       "n_positions": 128, "name": "tiny-gpt"}
GPU = "a100-pcie-40gb"
B, P, N = 2, 20, 6


def _passes(kv_cache, **run):
    """The prefill and the decode steps at each context, priced by iteration() with `run`."""
    looped = hf_loop(GPT, B)
    cap = P + N - 1 if kv_cache == "static" else None
    prefill = iteration(looped(graph_of(GPT, B, P, "inference", "fp32", last_logits=True,
                                        kv_cache=kv_cache, cache_len=cap), P, P), GPU, **run)

    def step(c, **how):
        return iteration(looped(graph_of(GPT, B, c, "decode", "fp32", kv_cache=kv_cache,
                                         cache_len=cap), c + 1, 1), GPU, **how)
    return prefill, step


def test_hf_compiles_a_static_caches_decode_steps_unless_disable_compile():
    # the criteria: disable_compile unset and a compileable cache that is no DynamicCache (the
    # kit's GPUs are all CUDA devices; no quantizer or offload is modelled)
    assert hf_auto_compiles("static") is True
    assert hf_auto_compiles("static", disable_compile=True) is False
    assert hf_auto_compiles("dynamic") is False
    assert hf_auto_compiles("dynamic", disable_compile=True) is False


def test_a_static_generates_decode_steps_are_compiled_cuda_graph_steps_its_prefill_as_asked():
    r = generation(GPT, GPU, batch=B, prompt=P, new_tokens=N)
    prefill, step = _passes("static")
    assert r["ttft_ms"] == pytest.approx(prefill.total_ms)  # eager, as asked (the default)
    assert len(r["decode_steps"]) == N - 1  # every context sampled: the sum is the steps' own
    for s in r["decode_steps"]:
        hf = step(s["context"], fusion="compiled", overhead=CUDA_GRAPH)
        assert s["ms"] == pytest.approx(hf.total_ms)
        assert s["kernel_ms"] == pytest.approx(hf.kernel_ms)
        assert s["ms"] < step(s["context"]).total_ms  # the eager step it had been priced as
    assert r["decode_ms"] == pytest.approx(sum(s["ms"] for s in r["decode_steps"]))
    assert r["priced"]["prefill"]["fusion"] == "eager" and not r["priced"]["prefill"]["cuda_graphs"]
    assert r["priced"]["decode"]["fusion"] == "compiled" and r["priced"]["decode"]["cuda_graphs"]
    assert "reduce-overhead" in r["priced"]["decode"]["why"]
    assert r["disable_compile"] is False and r["notes"] == [COMPILE_NOT_PRICED]


def test_disable_compile_prices_the_decode_steps_as_asked():
    eager = generation(GPT, GPU, batch=B, prompt=P, new_tokens=N, disable_compile=True)
    fused = generation(GPT, GPU, batch=B, prompt=P, new_tokens=N, fusion="compiled",
                       disable_compile=True)
    prefill, step = _passes("static")
    fused_prefill, _ = _passes("static", fusion="compiled")
    assert eager["ttft_ms"] == pytest.approx(prefill.total_ms)
    assert fused["ttft_ms"] == pytest.approx(fused_prefill.total_ms)
    for a, f in zip(eager["decode_steps"], fused["decode_steps"]):
        assert a["ms"] == pytest.approx(step(a["context"]).total_ms)
        # compiled kernels launched one by one from the host: no CUDA graph
        assert f["ms"] == pytest.approx(step(f["context"], fusion="compiled").total_ms)
    assert eager["priced"]["decode"] == {"fusion": "eager", "cuda_graphs": False,
                                         "why": "as asked: disable_compile=True"}
    assert eager["disable_compile"] is True and eager["notes"] == []


def test_cuda_graphs_asked_for_price_the_prefill_so_too():
    r = generation(GPT, GPU, batch=B, prompt=P, new_tokens=N, fusion="compiled", overhead=CUDA_GRAPH)
    prefill, step = _passes("static", fusion="compiled", overhead=CUDA_GRAPH)
    assert r["ttft_ms"] == pytest.approx(prefill.total_ms)
    assert r["priced"]["prefill"]["cuda_graphs"] and r["priced"]["prefill"]["why"].startswith("as asked")
    c = r["decode_steps"][0]["context"]
    assert r["decode_steps"][0]["ms"] == pytest.approx(step(c, fusion="compiled", overhead=CUDA_GRAPH).total_ms)


def test_a_dynamic_caches_generate_is_never_compiled():
    r = generation(GPT, GPU, batch=B, prompt=P, new_tokens=N, kv_cache="dynamic")
    _, step = _passes("dynamic")
    for s in r["decode_steps"]:
        assert s["ms"] == pytest.approx(step(s["context"]).total_ms)
    assert r["priced"]["decode"]["fusion"] == "eager" and not r["priced"]["decode"]["cuda_graphs"]
    assert "dynamic" in r["priced"]["decode"]["why"] and r["notes"] == []


def test_disable_compile_must_be_a_bool():
    with pytest.raises(KitError, match="disable_compile must be True or False"):
        generation(GPT, GPU, batch=B, prompt=P, new_tokens=N, disable_compile="yes")


def test_the_cli_takes_disable_compile_and_says_how_each_pass_was_priced(capsys):
    argv = ["predict", "gpt2", "--gpu", GPU, "--mode", "generate", "--batch", "2", "--seq", "16",
            "--new-tokens", "3"]
    hf = cli_json(capsys, argv)
    off = cli_json(capsys, argv + ["--disable-compile"])
    assert hf["priced"]["decode"]["cuda_graphs"] and not off["priced"]["decode"]["cuda_graphs"]
    assert hf["ttft_ms"] == pytest.approx(off["ttft_ms"]) and hf["tpot_ms"] < off["tpot_ms"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "priced    prefill: eager, launched op by op" in out
    assert "decode steps: compiled, replayed as a CUDA graph" in out
    assert main(argv + ["--disable-compile"]) == 0
    assert "decode steps: eager, launched op by op (as asked: disable_compile=True)" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["predict", "--help"])
    helped = " ".join(capsys.readouterr().out.split())
    assert "--disable-compile" in helped and "(default: off," in helped
    assert main(["predict", "gpt2", "--gpu", GPU, "--mode", "decode", "--disable-compile"]) == 2
    assert "--disable-compile goes with --mode generate" in capsys.readouterr().err
    comp = ["compare", "gpt2", "--gpus", GPU, "--mode", "generate", "--batch", "2", "--seq", "16",
            "--new-tokens", "3"]
    for extra, run in (([], hf), (["--disable-compile"], off)):
        c = cli_json(capsys, comp + extra)
        assert c["rows"][0]["tpot_ms"] == pytest.approx(run["tpot_ms"])
        assert c["priced"] == run["priced"] and c["disable_compile"] == bool(extra)
    assert main(comp) == 0
    assert "decode steps: compiled, replayed as a CUDA graph" in capsys.readouterr().out


@pytest.mark.parametrize("gpu", ["p4", "p100-pcie-16gb", "p100-sxm2-16gb"])
def test_hfs_default_generate_is_refused_where_inductor_cannot_compile(gpu, capsys):
    """P4 (CUDA capability 6.1) and P100 (6.0), the CUDA C++ Programming Guide's table: torch
    2.13's Inductor has no Triton backend under 7.0 (torch/utils/_triton.py:189-190, has_triton;
    torch/_inductor/scheduler.py:8492-8497 raises GPUTooOldForTriton), so HF 5.25's generate, which
    compiles a static cache's decode steps, fails there: no compiled time to price. Its
    disable_compile=True and a dynamic cache run eager; V100 (7.0) compiles."""
    with pytest.raises(KitError, match="disable-compile"):
        generation(GPT, gpu, batch=B, prompt=P, new_tokens=N)
    assert generation(GPT, gpu, batch=B, prompt=P, new_tokens=N, disable_compile=True)["tpot_ms"] > 0
    assert generation(GPT, gpu, batch=B, prompt=P, new_tokens=N, kv_cache="dynamic")["tpot_ms"] > 0
    assert main(["predict", "gpt2", "--gpu", gpu, "--mode", "generate", "--seq", "8",
                 "--new-tokens", "3"]) == 2
    err = capsys.readouterr().err
    assert "--disable-compile" in err and "Traceback" not in err


def test_a_volta_gpu_compiles():
    r = generation(GPT, "v100-sxm2-16gb", batch=B, prompt=P, new_tokens=N)
    assert r["priced"]["decode"]["cuda_graphs"]


def test_compare_shows_a_pascal_row_as_unsupported_not_the_whole_table(capsys):
    """kit compare --mode generate over a Volta and a Pascal card: HF's default (compiled)
    generate cannot run on the Pascal one (compile_refusal), so its row is unsupported with that
    reason while the Volta row is priced; one Pascal card had refused the whole comparison.
    With --disable-compile both rows are priced; with only Pascal cards, one error."""
    from kit.hardware import get_gpu
    from kit.workload.generation import compile_refusal

    argv = ["compare", "gpt2", "--gpus", "v100-pcie-32gb,p100-pcie-16gb", "--mode", "generate",
            "--batch", "2", "--seq", "16", "--new-tokens", "3", "--json"]
    assert main(argv) == 0
    rows = {r["gpu"]: r for r in json.loads(capsys.readouterr().out)["rows"]}
    assert rows["v100-pcie-32gb"]["step_ms"] > 0 and not rows["v100-pcie-32gb"]["unsupported"]
    assert rows["p100-pcie-16gb"]["step_ms"] is None
    assert rows["p100-pcie-16gb"]["unsupported"] == compile_refusal(get_gpu("p100-pcie-16gb"))
    assert main(argv + ["--disable-compile"]) == 0
    rows = {r["gpu"]: r for r in json.loads(capsys.readouterr().out)["rows"]}
    assert all(r["step_ms"] > 0 for r in rows.values())
    assert main(["compare", "gpt2", "--gpus", "p4,p100-pcie-16gb", "--mode", "generate", "--batch", "2",
                 "--seq", "16", "--new-tokens", "3"]) == 2
    assert "none of p4, p100-pcie-16gb can run it" in capsys.readouterr().err
