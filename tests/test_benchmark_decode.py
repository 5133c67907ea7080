"""benchmarks/decode_steps.py: a decode step of a zoo decoder runs for real (here on the CPU,
with a small config), its buffers are what the model expects, and the kit's prediction rides along."""
import torch
from benchmark_modules import load_benchmark

TINY = {"model_type": "gpt2", "n_embd": 32, "n_head": 2, "n_layer": 2, "vocab_size": 64,
        "n_positions": 32, "name": "tiny-gpt"}
LLAMA = {"model_type": "llama", "hidden_size": 32, "num_attention_heads": 4, "num_key_value_heads": 2,
         "num_hidden_layers": 2, "intermediate_size": 64, "vocab_size": 64, "name": "tiny-llama"}


def test_real_model_and_inputs_match_the_captured_shapes():
    bench = load_benchmark("decode_steps")
    m = bench.real_model(TINY, "fp32", "cpu")
    mask = m.transformer.h[0].attn.bias[0, 0]
    assert torch.equal(mask, torch.ones(32, 32, dtype=torch.bool).tril())
    ids, cache = bench.real_inputs(m, 3, 10, "fp32", "cpu")
    assert ids.shape == (3, 1) and len(cache) == 2 and cache[0][0].shape == (3, 2, 11, 16)
    with torch.no_grad():
        logits = m(ids, cache)
    assert logits.shape == (3, 1, 64) and torch.isfinite(logits).all()
    assert cache[0][0][:, :, 10].abs().sum() > 0  # the new token's keys were written at the end
    assert cache[0][0][:, :, :10].abs().sum() == 0
    llama = bench.real_model(LLAMA, "fp32", "cpu")
    freq = llama.inv_freq
    assert torch.allclose(freq, 1.0 / 10000.0 ** (torch.arange(0, 8, 2).float() / 8))


def test_measure_gives_a_time_and_the_prediction():
    bench = load_benchmark("decode_steps")
    row = bench.measure(LLAMA, batch=2, context=6, dtype="fp32", device="cpu", warmup=1,
                        repeats=3, gpu="a100-pcie-40gb")
    assert row["measured_ms"] > 0 and row["predicted_ms"] > 0
    assert row["predicted_gpu"] == "a100-pcie-40gb" and row["context"] == 6
    assert "measured_kernel_ms" not in row  # kernels are recorded on CUDA only


def test_a_dynamic_cache_runs_for_real():
    bench = load_benchmark("decode_steps")
    m = bench.real_model(LLAMA, "fp32", "cpu")
    ids, cache = bench.real_inputs(m, 2, 5, "fp32", "cpu", kind="dynamic")
    assert cache[0].kind == "dynamic" and cache[0].keys.shape == (2, 2, 5, 8)  # no slot yet
    with torch.no_grad():
        logits = m(ids, cache)
    assert logits.shape == (2, 1, 64) and torch.isfinite(logits).all()
