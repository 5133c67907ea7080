"""The multi-GPU layer: tied embeddings in a Llama-family config, experts that make
no layer MoE, --no-overlap under ZeRO-3 and --gpu-file beside --system."""
import json
import warnings

import pytest

from kit.errors import KitError
from kit.parallel import Layout, parse_model, predict_parallel
from kit.parallel.memory import local_params
from test_audit_single import _cache, _kit  # noqa: F401  (_cache: autouse, a fresh KIT_CACHE)

# Llama 3.2 1B's config.json (meta-llama/Llama-3.2-1B): 1,235,814,400 parameters, the LM head
# tied to the token embedding
LLAMA32_1B = {"model_type": "llama", "hidden_size": 2048, "intermediate_size": 8192,
              "num_hidden_layers": 16, "num_attention_heads": 32, "num_key_value_heads": 8,
              "vocab_size": 128256, "max_position_embeddings": 131072, "rms_norm_eps": 1e-5,
              "rope_theta": 500000.0, "tie_word_embeddings": True, "hidden_act": "silu"}


def test_a_llama_config_with_tied_embeddings_counts_them_once(tmp_path):
    tied = tmp_path / "tied.json"
    tied.write_text(json.dumps(LLAMA32_1B))
    untied = tmp_path / "untied.json"
    untied.write_text(json.dumps({**LLAMA32_1B, "tie_word_embeddings": False}))
    a, b = parse_model(str(tied)), parse_model(str(untied))
    extra = LLAMA32_1B["vocab_size"] * LLAMA32_1B["hidden_size"]
    assert a.tied and not b.tied and b.params - a.params == extra
    assert a.params == pytest.approx(1_235_814_400, rel=1e-3)  # biases it counts aside (was 1.50B)
    one = Layout(dp=2, dtype="bf16")
    assert local_params(b, one, 0) - local_params(a, one, 0) == extra  # pp 1: no output copy
    two = Layout(dp=2, pp=2, dtype="bf16")  # Megatron keeps a copy on the last stage
    assert local_params(b, two, 1) == local_params(a, two, 1)
    ra = predict_parallel(a, "dgx-a100", one)
    rb = predict_parallel(b, "dgx-a100", one)
    assert ra["memory_per_rank"][0]["total_gib"] < rb["memory_per_rank"][0]["total_gib"]


def test_zoo_llama_models_stay_untied_and_gpt2_tied():
    assert not parse_model("llama3-8b").tied and parse_model("gpt2").tied
    assert parse_model("llama:layers=2,hidden=512,heads=8,tied=true").tied


def test_experts_that_make_no_layer_moe_are_refused(capsys):
    with pytest.raises(KitError, match="makes none of its 1 layers MoE"):
        parse_model("moe:layers=1,hidden=512,heads=8,experts=4")
    assert parse_model("moe:layers=1,hidden=512,heads=8,experts=4,moe_every=1").experts == 4
    rc, _, err = _kit(capsys, "predict", "moe:layers=1,hidden=512,heads=8,experts=4", "--system",
                      "dgx-a100", "--dp", "2", "--ep", "2")
    assert rc == 2 and "makes none of its 1 layers MoE" in err


def test_no_overlap_under_zero3_gets_a_note():
    m = "gpt:layers=2,hidden=512,heads=8,seq=256"
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        off = predict_parallel(m, "dgx-a100", Layout(dp=2, zero=3, overlap_grad_reduce=False))
    assert any("ZeRO stage 3 (FSDP)" in str(x.message) for x in w)
    on = predict_parallel(m, "dgx-a100", Layout(dp=2, zero=3))
    assert off["iteration_ms"] == on["iteration_ms"]  # what the note says


def test_gpu_file_beside_system_is_refused(capsys, tmp_path):
    from pathlib import Path

    import kit.hardware
    from kit.hardware import unregister_gpu

    gpus = json.loads((Path(kit.hardware.__file__).parent / "gpus.json").read_text())
    entry = dict((gpus["gpus"] if isinstance(gpus, dict) else gpus)[0], key="review1-gpu",
                 name="Review1 GPU")
    entry.pop("aliases", None)
    f = tmp_path / "g.json"
    f.write_text(json.dumps({"gpus": [entry]}))
    try:  # the file's GPU had been registered and the preset's used, without a word
        rc, _, err = _kit(capsys, "predict", "gpt:layers=2,hidden=512,heads=8", "--system",
                          "dgx-a100", "--gpu-file", str(f))
    finally:
        unregister_gpu("review1-gpu")
    assert rc == 2 and "--gpu-file goes with --gpu" in err


def test_the_header_does_not_multiply_ep_into_the_world_size(capsys):
    rc, out, _ = _kit(capsys, "predict", "moe:layers=2,hidden=512,heads=8,experts=4", "--system",
                      "dgx-a100", "--dp", "2", "--ep", "2")
    assert rc == 0
    head = out.splitlines()[0]
    assert "dp 2 x tp 1 x pp 1 = 2 GPUs (ep 2 within dp)" in head and "x ep" not in head


def test_a_learned_position_table_keeps_its_rows_at_a_shorter_seq():
    # GPT-2's table has n_positions rows whatever the run's seq (seq 128 had counted 128 of 1,024)
    from kit.workload.zoo import build, config

    short, full = parse_model("gpt2", seq=128), parse_model("gpt2", seq=1024)
    assert short.positions == full.positions == config("gpt2")["n_positions"]
    assert short.params == full.params
    module = build("gpt2")  # on the meta device
    counted = sum(p.numel() for p in module.parameters())
    assert short.params == pytest.approx(counted, rel=2e-3)  # biases the spec counts aside
    one = Layout(dp=2)
    assert local_params(short, one, 0) == local_params(full, one, 0)
    with pytest.raises(KitError, match="positions .* at least seq 512"):
        parse_model("gpt:layers=2,hidden=256,heads=4,seq=512,positions=100")
    assert parse_model("gpt:layers=2,hidden=256,heads=4,seq=512,positions=1024").params - \
        parse_model("gpt:layers=2,hidden=256,heads=4,seq=512").params == 512 * 256


def test_reading_a_zoo_models_tied_embedding_imports_no_torch():
    # GPTSpec.tied had asked kit.workload.zoo_modern (which imports torch) whether a family ties
    # by default: the analytic multi-GPU layer (graph=False) of any zoo model imported torch
    import subprocess
    import sys

    code = ("import sys\n"
            "from kit.parallel import parse_model\n"
            "assert not parse_model('llama3-8b').tied and parse_model('gpt2').tied\n"
            "print('torch' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-800:]
    assert out.stdout.strip() == "False"


def test_gemma_families_tie_by_default_in_the_spec_and_the_zoo_module(tmp_path):
    # the one default both read (kit.workload.modes.TIED_BY_DEFAULT): a Gemma config without
    # tie_word_embeddings ties, a Mistral one does not, as HF's configs default
    from kit.workload.zoo import build

    base = {"hidden_size": 512, "intermediate_size": 1024, "num_hidden_layers": 2,
            "num_attention_heads": 8, "num_key_value_heads": 8, "vocab_size": 1000,
            "head_dim": 64}  # (left out, GemmaConfig's 256: 8 x 256 is not the 512 width)
    for kind, tied in (("gemma", True), ("mistral", False)):
        c = {**base, "model_type": kind}
        f = tmp_path / f"{kind}.json"
        f.write_text(json.dumps(c))
        spec = parse_model(str(f))
        module = build(c)
        assert spec.tied is tied and (module.lm_head.weight is module.embed_tokens.weight) is tied


def test_gpu_file_correcting_the_presets_own_gpu_still_reaches_system(capsys, tmp_path):
    # a file that gives the preset's GPU key replaces that GPU's spec (register_gpu), and
    # --system's prediction reads it: this had worked (2.42 -> 7.00 ms with a tenth of the
    # H100's bandwidth on dgx-h100) and the refusal above had taken it away
    from kit.hardware import get_gpu, unregister_gpu

    slow = dict(get_gpu("a100-sxm4-40gb").to_dict(), mem_bw_gbs=155.5, fp32_tflops=1.95,
                tf32_tflops=15.6, fp16_tflops=31.2, bf16_tflops=31.2, sm_count=11)
    f = tmp_path / "slow.json"
    f.write_text(json.dumps({"gpus": [slow]}))
    args = ("predict", "gpt:layers=2,hidden=512,heads=8,seq=256,vocab=1024", "--system", "dgx-a100",
            "--dp", "8", "--json")
    rc, out, err = _kit(capsys, *args)
    assert rc == 0, err
    base = json.loads(out)["iteration_ms"]
    try:
        rc, out, err = _kit(capsys, *args, "--gpu-file", str(f))
    finally:
        unregister_gpu("a100-sxm4-40gb")
    assert rc == 0, err
    assert json.loads(out)["iteration_ms"] > 2 * base


def test_a_gpt2_config_that_unties_its_head_is_untied_in_the_module_and_the_spec(tmp_path):
    from kit.workload.zoo import build, config

    c = {k: v for k, v in config("gpt2").items() if k != "name"}
    small = dict(c, n_layer=2, tie_word_embeddings=False)
    p = tmp_path / "untied_gpt2.json"
    p.write_text(json.dumps(small))
    spec, tied = parse_model(str(p)), parse_model("gpt2")
    assert not spec.tied and tied.tied
    counted = sum(x.numel() for x in build(small).parameters())
    counted_tied = sum(x.numel() for x in build(dict(small, tie_word_embeddings=True)).parameters())
    assert counted - counted_tied == small["vocab_size"] * small["n_embd"]  # the module unties too
    assert spec.params == pytest.approx(counted, rel=2e-3)


def test_an_opt_config_with_projected_embeddings_is_refused_not_mispriced(tmp_path):
    """OPT-350m (512-wide embeddings projected to 1024-wide layers) had been read as a plain
    GPT: 355,887,104 parameters against HF's 331,196,416, no projections priced."""
    cfg = {"model_type": "opt", "hidden_size": 1024, "ffn_dim": 4096, "num_hidden_layers": 24,
           "num_attention_heads": 16, "vocab_size": 50272, "max_position_embeddings": 2048,
           "word_embed_proj_dim": 512, "do_layer_norm_before": False}
    f = tmp_path / "opt350m.json"
    f.write_text(json.dumps(cfg))
    with pytest.raises(KitError, match="word_embed_proj_dim.*one GPU"):
        parse_model(str(f))
    same = tmp_path / "opt_same.json"  # a projection to its own width is none (OPT-1.3b's, pre-norm)
    same.write_text(json.dumps({**cfg, "word_embed_proj_dim": 1024, "do_layer_norm_before": True}))
    assert parse_model(str(same)).hidden == 1024
