"""torch's inference fast path for nn.TransformerEncoderLayer and nn.MultiheadAttention: the
capture decides as torch does on real tensors, and records the kernels torch's native code runs."""
import json

import pytest
import torch
import torch.nn as nn
from aten_log import AtenLog

from kit.workload import fast_path
from kit.workload.capture import _Recorder, capture

torch.set_num_threads(1)


def _torch_takes_fast_path(module, *args, grad=False, **kwargs) -> bool:
    """Whether torch itself runs the module's native kernel for this call on real CPU tensors
    (an encoder layer on its slow path may still run its attention's)."""
    native = ("_native_multi_head_attention" if isinstance(module, nn.MultiheadAttention)
              else "_transformer_encoder_layer_fwd")
    with torch.set_grad_enabled(grad), AtenLog() as log:
        module(*args, **kwargs)
    return native in log.ops


def _layer(**kw):
    torch.manual_seed(0)
    args = dict(d_model=32, nhead=4, dim_feedforward=64, batch_first=True, dropout=0.1)
    args.update(kw)
    return nn.TransformerEncoderLayer(**args).eval()


ENCODERS = {
    "default": {}, "gelu": {"activation": "gelu"}, "pre-norm": {"norm_first": True},
    "seq-first": {"batch_first": False}, "odd heads": {"nhead": 1},
    "custom activation": {"activation": lambda t: t * 2}, "no bias": {"bias": False},
}


@pytest.mark.parametrize("name", ENCODERS)
def test_encoder_layer_takes_the_fast_path_exactly_when_torch_does(name):
    layer = _layer(**ENCODERS[name])
    x = torch.randn(2, 6, 32)
    with torch.no_grad():
        why = fast_path.why_not_encoder(layer, x)
    assert (why == "") == _torch_takes_fast_path(layer, x), why


def test_encoder_layer_reasons_torch_would_give_for_the_slow_path():
    x = torch.randn(2, 6, 32)
    layer = _layer()
    with torch.no_grad():
        assert fast_path.why_not_encoder(layer, x) == ""
        assert fast_path.why_not_encoder(layer, x, user_hooks=True).startswith("forward pre-/hooks")
        layer.norm2.eps = 1e-3
        assert "eps" in fast_path.why_not_encoder(layer, x)
        assert not _torch_takes_fast_path(layer, x)
    layer = _layer()
    layer.train()
    assert fast_path.why_not_encoder(layer, x) == "training is enabled"
    layer.eval()  # grad enabled and weights that require grad: the slow path, in torch too
    assert fast_path.why_not_encoder(layer, x).startswith("grad is enabled")
    assert not _torch_takes_fast_path(layer, x, grad=True)


MHAS = {"self": ({}, "self"), "cross": ({}, "cross"), "seq-first": ({"batch_first": False}, "self"),
        "odd heads": ({"num_heads": 1}, "self"), "bias_kv": ({"add_bias_kv": True}, "self"),
        "kdim": ({"kdim": 16, "vdim": 16}, "self")}


@pytest.mark.parametrize("name", MHAS)
def test_attention_takes_the_fast_path_exactly_when_torch_does(name):
    kw, kind = MHAS[name]
    torch.manual_seed(0)
    mha = nn.MultiheadAttention(32, **{"num_heads": 4, "batch_first": True, **kw}).eval()
    x = torch.randn(2, 6, 32)
    kv = x if kind == "self" else torch.randn(2, 6, 32)
    if "kdim" in kw:
        kv = torch.randn(2, 6, 16)
    with torch.no_grad():
        why = fast_path.why_not_mha(mha, x, kv, kv)
    assert (why == "") == _torch_takes_fast_path(mha, x, kv, kv), why


def test_a_floating_mask_keeps_attention_on_the_slow_path_as_in_torch():
    mha = nn.MultiheadAttention(32, 4, batch_first=True).eval()
    x, mask = torch.randn(2, 6, 32), torch.zeros(6, 6)
    with torch.no_grad():
        assert "floating-point masks" in fast_path.why_not_mha(mha, x, x, x, attn_mask=mask)
    assert not _torch_takes_fast_path(mha, x, x, x, attn_mask=mask)
    assert _torch_takes_fast_path(mha, x, x, x, attn_mask=mask.bool())


@pytest.mark.parametrize("name", ["default", "gelu", "pre-norm"])
def test_encoder_layer_kernels_compute_what_torch_computes(name):
    layer = _layer(**ENCODERS[name])
    x = torch.randn(2, 6, 32)
    with torch.no_grad():
        expected = layer(x)
        got = fast_path.encoder_layer(layer, x, None, _Recorder(), {})
    assert torch.allclose(got, expected, atol=1e-5)


@pytest.mark.parametrize("need_weights,average", [(False, True), (True, True), (True, False)])
def test_attention_kernels_compute_what_torch_computes(need_weights, average):
    torch.manual_seed(1)
    mha = nn.MultiheadAttention(32, 4, batch_first=True).eval()
    x = torch.randn(2, 6, 32)
    with torch.no_grad():
        out, w = mha(x, x, x, need_weights=need_weights, average_attn_weights=average)
        got, got_w = fast_path.native_mha(x, mha, None, need_weights, average)
    assert torch.allclose(got, out, atol=1e-5)
    assert (got_w is None) == (w is None)
    if w is not None:
        assert got_w.shape == w.shape and torch.allclose(got_w, w, atol=1e-6)


class _Encoder(nn.Module):
    def __init__(self, layers=3, **kw):
        super().__init__()
        self.enc = nn.TransformerEncoder(_layer(d_model=64, dim_feedforward=256, **kw), layers,
                                         enable_nested_tensor=False)

    def forward(self, x):
        return self.enc(x)


def _kernels(graph):
    return [n.name() for n in graph.kernels()]


def test_inference_capture_records_torchs_native_encoder_kernels():
    batch, seq, layers = 4, 128, 3
    model = _Encoder(layers)
    g = capture(model, (torch.zeros(batch, seq, 64),), mode="inference")
    per_layer = ["addmm", "_scaled_dot_product_efficient_attention", "addmm", "add_",
                 "native_layer_norm", "_addmm_activation", "addmm", "add_", "native_layer_norm"]
    assert _kernels(g) == per_layer * layers
    assert g.meta["fast_path"] == {"taken": {"TransformerEncoderLayer": layers}, "declined": {}}
    gemms = [n.op for n in g.kernels() if n.op_class == "gemm"]
    assert all(op.b == 1 and op.m == batch * seq for op in gemms)  # one GEMM over every token
    assert [op.n for op in gemms[:4]] == [3 * 64, 64, 256, 64]
    modules = {n.module for n in g.kernels()}
    assert {"enc.layers.0.self_attn", "enc.layers.0.linear1", "enc.layers.2.norm2"} <= modules
    assert "forward" not in vars(model.enc.layers[0])  # the module's own forward is back
    # half precision routes the attention to flash attention, as torch's SDPA would
    half = capture(model, (torch.zeros(batch, seq, 64),), mode="inference", dtype="fp16")
    assert "_scaled_dot_product_flash_attention" in _kernels(half)


def test_a_slow_path_encoder_is_recorded_as_torch_runs_it_with_the_reason():
    model = _Encoder(2, batch_first=False)
    g = capture(model, (torch.zeros(128, 4, 64),), mode="inference")
    declined = g.meta["fast_path"]["declined"]
    assert declined["TransformerEncoderLayer: self_attn.batch_first was not True"] == 2
    assert g.meta["fast_path"]["taken"] == {}
    # the slow path folds the transposed input into one GEMM, as torch does with weights that
    # require grad
    assert all(n.op.b == 1 for n in g.kernels() if n.name() in ("mm", "addmm"))
    # and its attention is F.multi_head_attention_forward's call of SDPA (need_weights=False):
    # the fused kernel on a GPU (fp32: memory-efficient), not the CPU's bmm-softmax-bmm
    assert "_scaled_dot_product_efficient_attention" in _kernels(g)
    assert "bmm" not in _kernels(g)


def test_training_capture_is_untouched_and_a_users_hook_blocks_the_fast_path():
    model = _Encoder(2)
    assert "fast_path" not in capture(model, (torch.zeros(2, 16, 64),), mode="train").meta
    handle = model.enc.layers[0].linear1.register_forward_hook(lambda *a: None)
    try:
        g = capture(model, (torch.zeros(2, 16, 64),), mode="inference")
    finally:
        handle.remove()
    fast = g.meta["fast_path"]
    assert fast["taken"] == {"TransformerEncoderLayer": 1, "MultiheadAttention": 1}
    assert fast["declined"] == {
        "TransformerEncoderLayer: forward pre-/hooks are attached to the module": 1}


def test_a_failing_capture_gives_the_modules_their_forward_back():
    model = _Encoder(1)
    with pytest.raises(Exception):
        capture(model, (torch.zeros(2, 16, 48),), mode="inference")  # wrong width
    assert all("forward" not in vars(m) for m in model.modules())


def test_standalone_attention_records_the_unfused_kernels_when_weights_are_returned():
    class Attn(nn.Module):
        def __init__(self):
            super().__init__()
            self.attn = nn.MultiheadAttention(64, 4, batch_first=True)

        def forward(self, x):
            return self.attn(x, x, x)[0]  # need_weights defaults to True

    g = capture(Attn(), (torch.zeros(2, 32, 64),), mode="inference")
    assert _kernels(g) == ["mm", "add", "baddbmm", "_softmax", "bmm", "clone", "addmm", "sum",
                           "div_"]
    assert g.meta["fast_path"]["taken"] == {"MultiheadAttention": 1}


ENCODER_MODULE = '''
import torch, torch.nn as nn

class Encoder(nn.Module):
    def __init__(self, batch_first):
        super().__init__()
        self.batch_first = batch_first
        layer = nn.TransformerEncoderLayer(64, 4, 256, batch_first=batch_first)
        self.enc = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)

    def forward(self, x):
        return self.enc(x)

    def example_inputs(self, batch, seq):
        return (torch.zeros(batch, seq, 64) if self.batch_first else torch.zeros(seq, batch, 64),)

def fast():
    return Encoder(True)

def slow():
    return Encoder(False)
'''


def test_kit_predict_says_which_path_torch_takes(tmp_path, monkeypatch, capsys):
    from kit.cli import main

    (tmp_path / "encmodel.py").write_text(ENCODER_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    args = ["--gpu", "a100-pcie-40gb", "--mode", "inference", "--batch", "8", "--seq", "256"]
    assert main(["predict", "encmodel:fast", *args]) == 0
    fast = capsys.readouterr().out
    assert "torch's native inference fast path: TransformerEncoderLayer x2" in fast
    assert main(["predict", "encmodel:slow", *args]) == 0
    slow = capsys.readouterr().out
    assert "slow path (as torch would run it) x2: TransformerEncoderLayer: self_attn.batch_first" in slow
    assert main(["predict", "encmodel:fast", *args, "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["fast_path"]["taken"] == {"TransformerEncoderLayer": 2}
    # the same layers on the slow path take longer: separate bias, ReLU and softmax kernels
    assert main(["predict", "encmodel:slow", *args, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["kernels"] > r["kernels"]
