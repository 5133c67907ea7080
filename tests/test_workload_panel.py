"""The whole-model panel redraws from its controls and shows what kit predicts."""
import pytest

from kit.api import predict_model
from widgets.base import Panel
from widgets.whole_model import WholeModelPanel


def test_panel_follows_controls():
    p = WholeModelPanel(model="gpt2", gpu="a100-pcie-40gb", mode="inference", batch=1, seq=32)
    assert isinstance(p, Panel) and "kit-panel" in p.root._dom_classes
    rows = p.chart_data()
    classes = {r["op_class"] for r in rows if "op_class" in r}
    assert {"gemm", "elementwise"} <= classes
    expected = predict_model("gpt2", "a100-pcie-40gb", "inference", 1, 32).kernel_ms
    assert sum(r["ms"] for r in rows if "ms" in r) == pytest.approx(expected, rel=1e-4)
    tracks = {r["track"] for r in rows if "track" in r}
    assert tracks == {"CPU issue", "GPU"}
    assert len(rows) < 5000
    first = p.result.total_ms
    p.gpu.value = "t4"  # slower GPU: the step takes longer
    assert p.result.gpu == "t4" and p.result.total_ms > first
    p.fusion.value = "compiled"
    assert any(r.get("op_class") == "fused" for r in p.chart_data())
    assert "ms</b>" in p.summary.value


def test_seq_choices_follow_the_model_position_table():
    from kit.errors import KitError
    from kit.workload.zoo import max_seq

    p = WholeModelPanel(model="gpt2", gpu="a100-pcie-40gb", mode="inference", batch=1, seq=1024)
    assert max(p.seq.options) == max_seq("gpt2") == 1024 and 2048 not in p.seq.options
    p.model.value = "bert-base"   # 512 positions: 1024 is no longer offered, the panel clamps to 512
    assert max(p.seq.options) == 512 and p.seq.value == 512
    assert p.result.total_ms > 0 and "ms</b>" in p.summary.value
    p.model.value = "llama3-8b"   # rotary: no table, every length is offered again, and the
    assert 2048 in p.seq.options and p.seq.value == 1024  # reader's 1024 comes back
    p.seq.value = 2048  # a new choice of the reader's, clamped by gpt2 and back with llama
    p.model.value = "gpt2"
    assert p.seq.value == 1024
    p.model.value = "llama3-8b"
    assert p.seq.value == 2048 and p.result.meta["seq"] == 2048
    with pytest.raises(KitError, match="learned positions"):
        WholeModelPanel(model="bert-base", seq=1024)


def test_decode_is_offered_for_decoders_only_and_leaves_a_position_for_the_new_token():
    from kit.errors import KitError

    p = WholeModelPanel(model="gpt2", gpu="a100-pcie-40gb", mode="decode", batch=4, seq=512)
    assert p.result.mode == "decode" and "decode" in p.mode.options
    want = predict_model("gpt2", "a100-pcie-40gb", "decode", 4, 512)
    assert p.result.total_ms == pytest.approx(want.total_ms)
    assert "token step" in p.summary.value and "tokens/s" in p.summary.value
    assert 1024 not in p.seq.options  # gpt2 has 1024 positions: a context of 1023 at most
    p.model.value = "bert-base"  # an encoder has no decode step: the panel falls back
    assert "decode" not in p.mode.options and p.mode.value == "inference"
    assert p.result.mode == "inference"
    p.model.value = "gpt2"  # and the reader's decode comes back with a decoder
    assert p.mode.value == "decode" and p.result.mode == "decode"
    p.model.value = "gpt2"
    p.mode.value = "inference"
    p.seq.value = 1024
    p.mode.value = "decode"
    assert p.seq.value == 512 and p.result.mode == "decode"
    with pytest.raises(KitError, match="decoder-only"):
        WholeModelPanel(model="bert-base", mode="decode")


def test_the_cache_kind_drives_a_decode_step_and_is_off_in_the_other_modes():
    p = WholeModelPanel(model="gpt2", gpu="a100-pcie-40gb", mode="decode", batch=8, seq=512)
    static_gpu_ms = p.result.kernel_ms
    assert not p.kv_cache.disabled and "static KV cache" in p.summary.value
    p.kv_cache.value = "dynamic"  # grown by torch.cat: every step re-reads and re-writes the cache
    want = predict_model("gpt2", "a100-pcie-40gb", "decode", 8, 512, kv_cache="dynamic")
    assert p.result.total_ms == pytest.approx(want.total_ms)
    assert p.result.kernel_ms > static_gpu_ms  # more GPU work (eager gpt2 still waits on the CPU)
    assert "dynamic KV cache" in p.summary.value
    p.mode.value = "inference"  # no cache: the control is off and takes no part
    assert p.kv_cache.disabled and p.result.mode == "inference"
    assert p.result.total_ms == pytest.approx(predict_model("gpt2", "a100-pcie-40gb", "inference",
                                                            8, 512).total_ms)
    from kit.errors import KitError

    with pytest.raises(KitError, match="kv_cache 'paged' is not one of its choices"):
        WholeModelPanel(model="gpt2", mode="decode", kv_cache="paged")


def test_generate_shows_first_token_then_decode_and_leaves_positions_for_the_new_tokens():
    from kit.api import predict_generation
    from kit.errors import KitError

    p = WholeModelPanel(model="gpt2", gpu="a100-pcie-40gb", mode="generate", batch=4, seq=256,
                        new_tokens=32)
    want = predict_generation("gpt2", "a100-pcie-40gb", batch=4, prompt=256, new_tokens=32)
    assert p.result["ttft_ms"] == pytest.approx(want["ttft_ms"])
    assert p.result["tpot_ms"] == pytest.approx(want["tpot_ms"])
    assert not p.new_tokens.disabled and not p.kv_cache.disabled
    rows = p.chart_data()
    split = {}
    for r in rows:
        if "part" in r:
            split[r["part"]] = split.get(r["part"], 0.0) + r["ms"]
    assert split["prefill (first token)"] == pytest.approx(want["ttft_ms"], rel=1e-4)
    assert split["decode (31 tokens)"] == pytest.approx(want["decode_ms"], rel=1e-4)
    steps = [r for r in rows if "tokens in cache" in r]
    assert [s["tokens in cache"] for s in steps] == [s["context"] for s in want["decode_steps"]]
    assert "TTFT" in p.summary.value and "TPOT" in p.summary.value
    # gpt2 has 1024 positions: 256 new tokens after a prompt leave 769 for it
    p.new_tokens.value = 256
    assert max(p.seq.options) <= 1024 - 255 and p.result["new_tokens"] == 256
    assert p.result["total_ms"] > want["total_ms"]
    static_gpu_ms = p.result["decode_kernel_ms"]
    p.kv_cache.value = "dynamic"  # torch.cat every step, over the context only
    assert p.result["kv_cache"] == "dynamic" and "dynamic KV cache" in p.summary.value
    # the panel's dynamic steps are generation's own; gpt2's differ from its static ones (which,
    # as HF 5.25 runs them, read the whole preallocated cache and launch StaticLayer's position
    # and counter kernels: no longer fewer kernels' time at batch 4)
    dynamic = predict_generation("gpt2", "a100-pcie-40gb", batch=4, prompt=p.result["prompt"],
                                 new_tokens=256, kv_cache="dynamic")
    assert p.result["decode_kernel_ms"] == pytest.approx(dynamic["decode_kernel_ms"])
    assert p.result["decode_kernel_ms"] != pytest.approx(static_gpu_ms)
    p.mode.value = "inference"  # one pass: the new-tokens control is off
    assert p.new_tokens.disabled and p.kv_cache.disabled and p.result.mode == "inference"
    p.mode.value = "generate"
    p.model.value = "bert-base"  # an encoder generates nothing: the panel falls back
    assert "generate" not in p.mode.options and p.result.mode == "inference"
    with pytest.raises(KitError, match="new_tokens 5 is not one of its choices"):
        WholeModelPanel(model="gpt2", mode="generate", new_tokens=5)
    with pytest.raises(KitError, match="mode generate needs a decoder-only model"):
        WholeModelPanel(model="bert-base", mode="generate")
    with pytest.raises(KitError, match="positions"):
        WholeModelPanel(model="gpt2", mode="generate", seq=1024, new_tokens=16)


def test_dtype_follows_what_the_gpu_supports():
    from kit.errors import KitError

    p = WholeModelPanel(model="gpt2", gpu="a100-pcie-40gb", mode="inference", batch=4, seq=256,
                        dtype="bf16")
    want = predict_model("gpt2", "a100-pcie-40gb", "inference", 4, 256, dtype="bf16")
    assert p.result.total_ms == pytest.approx(want.total_ms) and "bf16" in p.summary.value
    fp32 = predict_model("gpt2", "a100-pcie-40gb", "inference", 4, 256).kernel_ms
    assert p.result.kernel_ms < fp32  # tensor cores: half precision does the GEMMs faster
    p.gpu.value = "t4"  # Turing has no bf16: the control narrows and falls back to fp16
    assert list(p.dtype.options) == ["fp32", "fp16"] and p.dtype.value == "fp16"
    assert p.result.total_ms == pytest.approx(
        predict_model("gpt2", "t4", "inference", 4, 256, dtype="fp16").total_ms)
    p.gpu.value = "h100-sxm"  # bf16 again: the reader's choice comes back
    assert "bf16" in p.dtype.options and p.dtype.value == "bf16"
    p.dtype.value = "fp16"  # the reader's new choice stays through a GPU without bf16
    p.gpu.value = "t4"
    p.gpu.value = "h100-sxm"
    assert p.dtype.value == "fp16"
    p.mode.value = "generate"
    assert p.result["dtype"] == "fp16" and "fp16" in p.summary.value
    with pytest.raises(KitError, match="no bf16 support"):
        WholeModelPanel(model="gpt2", gpu="t4", dtype="bf16")
    with pytest.raises(KitError, match="dtype 'fp8' is not one of its choices"):
        WholeModelPanel(model="gpt2", dtype="fp8")
