"""Loaded weights predict in numpy: the same numbers as the torch networks they were saved from,
and no torch import on the prediction path."""
import subprocess
import sys

import numpy as np
import pytest

from kit.predict.weights import has_shipped


def _torch_twin(net):
    from kit.predict.nets import MLP

    twin = MLP(net.n_in, net.n_out, hidden=net.hidden, depth=2)
    twin.load_state_dict(net.state_dict())
    return twin.eval()


def test_array_mlp_equals_the_torch_mlp():
    import torch

    from kit.predict.array_mlp import ArrayMLP
    from kit.predict.nets import MLP

    torch.manual_seed(0)
    net = MLP(5, 3, hidden=16, depth=2)
    x = np.random.default_rng(0).normal(size=(200, 5)).astype(np.float32) * 3
    net.set_scale(x[:100])  # half the rows fall outside the range: the clamp matters
    with torch.no_grad():
        net.net[0].weight.mul_(4)  # large activations exercise SiLU's tails
        want = net(torch.as_tensor(x)).numpy()
    got = ArrayMLP({k: v.numpy() for k, v in net.state_dict().items()}, 5, 3, hidden=16)(x)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_array_mlp_refuses_a_state_that_does_not_fit():
    from kit.predict.array_mlp import ArrayMLP

    state = {k: np.zeros(4, np.float32) for k in ("x_mean", "x_std", "x_min", "x_max")}
    with pytest.raises(KeyError, match="missing"):
        ArrayMLP(state, 4, 3, hidden=8)
    state.update({"net.0.weight": np.zeros((8, 4)), "net.0.bias": np.zeros(8),
                  "net.2.weight": np.zeros((8, 8)), "net.2.bias": np.zeros(8),
                  "net.4.weight": np.zeros((3, 9)), "net.4.bias": np.zeros(3)})
    with pytest.raises(ValueError, match="net.4.weight"):
        ArrayMLP(state, 4, 3, hidden=8)


@pytest.mark.skipif(not has_shipped(), reason="no shipped weights in this checkout")
def test_shipped_quantiles_equal_their_torch_networks():
    from kit.ops import Gemm
    from kit.predict.features import arrays_from_ops
    from kit.predict.weights import shipped_bundle

    tile = shipped_bundle().tile
    gemms = [Gemm(m=m, n=n, k=k) for m, n, k in [(64, 64, 64), (4096, 1024, 512), (8192, 8192, 8192)]]
    a = arrays_from_ops("gemm", gemms)
    chooser = tile.chooser
    from kit.predict.tile_choice import shape_matrix
    import torch

    x = shape_matrix(a, "l4")
    with torch.no_grad():
        want = _torch_twin(chooser.model)(torch.as_tensor(x, dtype=torch.float32)).numpy().argmax(1)
    assert (chooser.choose_index(a, "l4") == want).all()

    model = tile.models["layernorm"]
    rng = np.random.default_rng(1)
    x = rng.normal(size=(50, model.n_in)).astype(np.float32)
    lb = rng.normal(size=50).astype(np.float32)
    got = model.log_quantiles(x, lb)
    from kit.predict.tile_ensemble import HEADS

    with torch.no_grad():
        want = np.stack([HEADS[model.mode](_torch_twin(m)(torch.as_tensor(x)), torch.as_tensor(lb)).numpy()
                         for m in model.members])
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.skipif(not has_shipped(), reason="no shipped weights in this checkout")
def test_predicting_with_shipped_weights_imports_no_torch():
    code = ("import sys\n"
            "from kit.ops import Gemm, Softmax\n"
            "from kit.predict import get_predictor\n"
            "df = get_predictor('tile').predict([Gemm(m=1024, n=1024, k=1024), Softmax(4096, 1024)], 'l4')\n"
            "assert (df.latency_ms >= df.roofline_ms).all() and (df.latency_ms > 0).all()\n"
            "print('torch' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"
