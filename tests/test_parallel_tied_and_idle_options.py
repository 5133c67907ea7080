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
