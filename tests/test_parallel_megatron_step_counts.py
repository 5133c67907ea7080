"""The multi-GPU GPT layer's parameter counts, optimizer step and dropout against what the
modules and Megatron-LM hold and run: biases only where a model has them (GQA's QKV bias is
h + 2·kv_heads·head_dim), the mixed-precision step's gradient and weight copies, and no dropout
kernels or masks at dropout 0."""
import pandas as pd
import pytest

from kit import ops
from kit.errors import KitError
from kit.hardware.system import get_system
from kit.parallel.costs import Coster, optimizer_ms
from kit.parallel.gpt import GPTSpec, embedding_forward, layer_forward, parse_model
from kit.parallel.layout import Layout
from kit.parallel.memory import activation_bytes_per_layer, edge_activation_bytes, layer_rank_params


def _torch_counts(name):
    from kit.workload.zoo import build

    model = build(name)
    layer0 = next(m for n, m in model.named_modules() if n.endswith("layers.0") or n.endswith(".h.0"))
    return sum(p.numel() for p in layer0.parameters()), sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("name", ["llama3-8b", "qwen2.5-7b", "mixtral-8x7b", "gpt2"])
def test_layer_and_model_params_are_the_zoo_modules(name):
    # Llama/Mixtral: no linear biases, RMSNorm weights only; Qwen2: q, k, v biases; GPT-2: all
    layer, total = _torch_counts(name)
    spec = parse_model(name)
    assert spec.layer_params(0) == layer
    assert spec.params == total


def test_gqa_qkv_bias_is_h_plus_2_kv_heads_head_dim():
    torch = pytest.importorskip("torch")
    h, heads, kv_heads, f = 512, 8, 2, 2048
    spec = parse_model(f"gpt:layers=1,hidden={h},heads={heads},kv_heads={kv_heads},ffn={f}")
    kv = kv_heads * h // heads
    layer = torch.nn.ModuleList([torch.nn.LayerNorm(h), torch.nn.Linear(h, h + 2 * kv), torch.nn.Linear(h, h),
                                 torch.nn.LayerNorm(h), torch.nn.Linear(h, f), torch.nn.Linear(f, h)])
    assert spec.layer_params(0) == sum(p.numel() for p in layer.parameters())


@pytest.mark.parametrize("tp", [1, 2, 8])
def test_a_bias_free_layer_keeps_only_its_rmsnorm_weights_whole_on_every_tp_rank(tp):
    spec = parse_model("llama:layers=2,hidden=1024,heads=16,kv_heads=8,ffn=4096,vocab=32000")
    dense, _ = layer_rank_params(spec, Layout(tp=tp), 0)
    kept = 2 * spec.hidden  # the two RMSNorm weights; everything else is split over the tp ranks
    assert dense == pytest.approx((spec.layer_params(0) - kept) / tp + kept)


class _BytesPredictor:
    """1 ms per GB an op moves: an optimizer step's time is then its bytes."""

    name = "bytes-stub"

    def predict(self, op_list, gpu):
        return pd.DataFrame({"latency_ms": [op.bytes / 1e9 for op in op_list]})


@pytest.mark.parametrize("dtype, grad_dtype, per_param", [
    ("fp16", "fp16", 6 + 8 + 4 + 28 + 6),  # grad copy, unscale, norm, Adam, weight copy
    ("bf16", "fp32", 4 + 28 + 6),  # main_grad already fp32: no copy, no loss scaler
    ("bf16", "bf16", 6 + 4 + 28 + 6),
    ("fp32", "fp32", 4 + 28),
])
@pytest.mark.parametrize("zero, dp", [(0, 1), (1, 4)])
def test_optimizer_step_moves_megatron_mixed_precision_bytes(dtype, grad_dtype, per_param, zero, dp):
    lay = Layout(dp=dp, zero=zero, dtype=dtype, grad_dtype=grad_dtype)
    coster = Coster(lay, get_system("dgx-a100"), _BytesPredictor(), in_stream=False)
    n = 1 << 24
    kept = n // dp if zero else n  # ZeRO-1 / the distributed optimizer steps its shard
    assert optimizer_ms(n, lay, coster) * 1e9 == pytest.approx(per_param * kept, rel=1e-6)


def _dropouts(blocks):
    return [op for blk in blocks for op in blk.ops if isinstance(op, ops.Dropout)]


@pytest.mark.parametrize("attention", ["flash", "unfused"])
def test_dropout_zero_runs_no_dropout_and_keeps_no_masks(attention):
    base = dict(layers=2, hidden=1024, heads=16, seq=512, vocab=32000, attention=attention)
    drop, none = GPTSpec(**base, dropout=0.1), GPTSpec(**base, dropout=0.0)
    s, h, a = 512, 1024, 16
    for tp in (1, 2):
        lay = Layout(tp=tp, micro_batch=2)
        assert _dropouts(layer_forward(drop, 2, tp, 1, False, "fp16"))
        assert not _dropouts(layer_forward(none, 2, tp, 1, False, "fp16"))
        assert not _dropouts(embedding_forward(none, 2, tp, "fp16"))
        # Korthikanti et al.: the two hidden masks are 2h of 10h; unfused, the scores' 5as are the
        # softmax output (2as), its mask (as) and the dropout's output (2as), only the first kept
        saved = 2 * h + (3 * a * s / tp if attention == "unfused" else 0)
        diff = activation_bytes_per_layer(drop, lay, 0) - activation_bytes_per_layer(none, lay, 0)
        assert diff == pytest.approx(s * 2 * saved)
        assert edge_activation_bytes(none, lay, 0)[0] == 0 < edge_activation_bytes(drop, lay, 0)[0]


def test_dropout_follows_the_model():
    assert parse_model("llama3-8b").dropout == 0.0  # HF's Llama layers have none
    assert parse_model("llama:layers=2,hidden=256,heads=4").dropout == 0.0
    assert parse_model("gpt2").dropout == 0.1  # resid_pdrop
    assert parse_model("gpt:layers=2,hidden=256,heads=4").dropout == 0.1  # Megatron's default
    assert parse_model("gpt:layers=2,hidden=256,heads=4,dropout=0").dropout == 0.0
    from kit.errors import KitError

    with pytest.raises(KitError, match="dropout"):
        GPTSpec(layers=1, hidden=256, heads=4, dropout=1.0)


@pytest.mark.parametrize("family", ["gpt_neox", "bloom", "falcon"])
def test_a_config_with_hidden_dropout_is_of_a_family_the_layer_refuses(tmp_path, family):
    # GPT-NeoX, BLOOM and Falcon name their dropout hidden_dropout (0.0 in their configs), which
    # had been read (9ddd56c); their layers are not GPT-2's (attention beside the MLP, rotary or
    # ALiBi positions, untied or multi-query), so the multi-GPU path refuses them whole
    import json

    cfg = {"model_type": family, "hidden_size": 256, "num_hidden_layers": 2, "num_attention_heads": 4,
           "intermediate_size": 1024, "vocab_size": 1000, "max_position_embeddings": 128, "hidden_dropout": 0.0}
    path = tmp_path / "cfg.json"
    path.write_text(json.dumps(cfg))
    with pytest.raises(KitError, match=repr(family)):
        parse_model(str(path))


@pytest.mark.parametrize("zero, dp, zeroed", [(0, 1, True), (1, 2, True), (2, 2, False)])
def test_each_iteration_zeroes_the_whole_main_grad_buffer(zero, dp, zeroed):
    """Megatron's train_step calls zero_grad_buffer() before the first forward: one zero_() of
    the contiguous main_grad buffer (megatron-core 0.16.1 distributed/param_and_grad_buffer.py
    line 962), a gradient for every parameter of the rank, in the gradient dtype (fp32 for a
    bf16 model), with the distributed optimizer (ZeRO-1) too. A fill writes and reads nothing:
    gpt2 on one rank holds HF's 124,439,808 parameters with the vocabulary padded to 50,304
    (+47 rows of 768), x 4 bytes. ZeRO-2/3 (DeepSpeed, FSDP) keep no such buffer."""
    from kit.parallel.build import build_iteration

    lay = Layout(dp=dp, zero=zero, micro_batch=1, global_batch=2 * dp, dtype="bf16")
    g, _, _ = build_iteration(parse_model("gpt2"), lay, get_system("dgx-a100"), _BytesPredictor())
    zero_ops = [i for i, (label, res) in enumerate(zip(g.label, g.resource))
                if label == "zero grad buffer" and res == "compute"]
    if not zeroed:
        assert zero_ops == []
        return
    assert len(zero_ops) == 1
    assert g.dur_ms[zero_ops[0]] * 1e9 == pytest.approx((124_439_808 + 47 * 768) * 4, rel=1e-9)
    # before the first forward on the compute stream
    first = min(i for i, r in enumerate(g.resource) if r == "compute" and i != zero_ops[0])
    assert zero_ops[0] < first


def test_a_layout_without_the_optimizer_step_zeroes_no_grad_buffer():
    """Layout.optimizer_step False is forward, backward and the gradient sync only (what
    NeuSight's 4-GPU labels time): Megatron's zero_grad_buffer() belongs to the step around
    them, so no zero-fill is charged; the same layout with the step has it."""
    from kit.parallel.build import build_iteration
    from kit.parallel.neusight import label_layout

    lay = label_layout("dp4", 4)
    assert lay.optimizer_step is False
    for step, expected in ((False, 0), (True, 1)):
        g, _, _ = build_iteration(parse_model("gpt2"), lay.with_(optimizer_step=step), get_system("dgx-a100"),
                                  _BytesPredictor())
        assert sum(label == "zero grad buffer" and res == "compute"
                   for label, res in zip(g.label, g.resource)) == expected
