"""From the capture audit: valid PyTorch that the capture refused or took wrongly. Attention on
3-D and 2-D inputs (torch's math path), GEMMs of mismatched dtypes (int64 token ids into a float
nn.Linear: refused as torch refuses them), nn.TransformerEncoder's key-padding mask in inference,
packed sequences and sparse embeddings (a clear error, or a cost at the sparse size), and a
sequence-first module's batch."""
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode

from kit.cli import main
from kit.errors import KitError
from kit.workload.capture import capture
from kit.workload.models import graph_of


class Sdpa(nn.Module):
    def __init__(self):
        super().__init__()
        self.l = nn.Linear(64, 192)

    def forward(self, x):
        q, k, v = self.l(x).chunk(3, -1)
        return F.scaled_dot_product_attention(q, k, v)


@pytest.mark.parametrize("shape", [(4, 128, 64), (128, 64)])
@pytest.mark.parametrize("mode,dtype", [("inference", "bf16"), ("train", "bf16"), ("train", "fp32")])
def test_attention_without_a_heads_dimension_captures(shape, mode, dtype):
    """It failed: "Dimension out of range" (3-D), "tuple index out of range" (2-D). A GPU runs
    torch's math path for it (the fused kernels take 4-D inputs): its GEMMs are torch's."""
    x = torch.randn(*shape)
    g = capture(Sdpa(), (x,), mode=mode, dtype=dtype)
    with FlopCounterMode(display=False) as counter:  # real torch, on the CPU
        Sdpa()(x)
    fwd = sum(n.op.flops for n in g.nodes if n.phase == "fwd" and n.op_class == "gemm")
    assert fwd == counter.get_total_flops()
    assert not g.unknown_ops()


class FeatureMLP(nn.Module):  # expects float features, and has no example_inputs
    def __init__(self):
        super().__init__()
        self.l1, self.l2 = nn.Linear(512, 256), nn.Linear(256, 10)

    def forward(self, x):
        return self.l2(self.l1(x).relu())


def test_token_ids_into_a_float_linear_are_refused_as_torch_refuses_them():
    """Meta kernels do not check dtypes: the kit costed a GEMM over int64 token ids."""
    with pytest.raises(RuntimeError, match="dtype"):  # the reference: real torch
        FeatureMLP()(torch.zeros(8, 512, dtype=torch.long))
    with pytest.raises(KitError, match=r"module 'l1' at aten\.addmm.*int64.*example_inputs"):
        graph_of(FeatureMLP(), batch=8, mode="inference")
    assert graph_of(FeatureMLP(), None, mode="inference", inputs=(torch.randn(8, 512),))  # floats: fine


def test_the_cli_says_so_in_one_line(tmp_path, monkeypatch, capsys):
    (tmp_path / "audit_int_ids.py").write_text(
        "import torch.nn as nn\n"
        "def make():\n    return nn.Sequential(nn.Linear(512, 64), nn.ReLU(), nn.Linear(64, 10))\n")
    monkeypatch.chdir(tmp_path)
    assert main(["predict", "audit_int_ids:make", "--gpu", "a100-sxm4-80gb", "--batch", "8"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "different dtypes" in err and "'0'" in err


def _encoder(**kwargs):
    return nn.TransformerEncoder(nn.TransformerEncoderLayer(64, 4, 128, batch_first=True), 2, **kwargs)


def test_a_key_padding_mask_on_a_nested_tensor_encoder_is_costed_for_every_token():
    """enable_nested_tensor=True (the default) failed in inference: no meta kernel for
    _nested_tensor_from_mask_left_aligned. The same encoder without it is the reference."""
    x, pad = torch.randn(2, 16, 64), torch.zeros(2, 16, dtype=torch.bool)
    pad[:, 12:] = True
    nested = _encoder()
    g = capture(nested, (x, None, pad), mode="inference")
    plain = capture(_encoder(enable_nested_tensor=False), (x, None, pad), mode="inference")
    assert [(n.aten, n.op) for n in g.nodes] == [(n.aten, n.op) for n in plain.nodes]
    assert nested.use_nested_tensor  # given back as it was


class Packed(nn.Module):
    def __init__(self, enforce_sorted):
        super().__init__()
        self.lstm, self.enforce_sorted = nn.LSTM(16, 32), enforce_sorted

    def forward(self, x, lengths):
        p = nn.utils.rnn.pack_padded_sequence(x, lengths, enforce_sorted=self.enforce_sorted)
        return nn.utils.rnn.pad_packed_sequence(self.lstm(p)[0])[0]


@pytest.mark.parametrize("lengths,enforce_sorted", [(torch.tensor([10, 9, 7]), True),
                                                    ([10, 9, 7], False)])
def test_packed_sequences_say_what_captures(lengths, enforce_sorted):
    """CPU lengths were moved to meta ("'lengths' argument should be a 1D CPU int64 tensor"), and
    unsorting asked for MoE-style static shapes."""
    with pytest.raises(KitError, match="packed sequence.*Python list.*enforce_sorted=True") as e:
        capture(Packed(enforce_sorted), (torch.randn(10, 3, 16), lengths), mode="inference")
    assert "mixture-of-experts" not in str(e.value)


@pytest.mark.parametrize("mode", ["inference", "train"])
def test_packed_sequences_with_sorted_list_lengths_capture(mode):
    g = capture(Packed(True), (torch.randn(10, 3, 16), [10, 9, 7]), mode=mode)
    assert g.nodes


class Sparse(nn.Module):
    def __init__(self, **kwargs):
        super().__init__()
        self.e, self.l = nn.Embedding(10000, 32, sparse=True, **kwargs), nn.Linear(32, 1)

    def forward(self, ids):
        return self.l(self.e(ids))


def test_a_sparse_embedding_with_padding_says_what_fails():
    """It got the MoE-routing advice: "give that code static shapes (for mixture-of-experts...)"."""
    with pytest.raises(KitError, match="'e'.*sparse=True.*sparse=False") as e:
        capture(Sparse(padding_idx=0), (torch.randint(0, 10000, (8, 20)),), mode="train")
    assert "mixture-of-experts" not in str(e.value)


def test_a_sparse_gradient_is_costed_at_its_rows():
    """Its gradient's clone and its _indices/_values views were costed at the table's dense size."""
    ids = torch.randint(0, 10000, (8, 20))
    g = capture(Sparse(), (ids,), mode="train")
    grad = [n for n in g.nodes if n.phase == "bwd" and n.module == "e" and n.op is not None]
    rows = ids.numel() * (32 * 4 + 8)  # each id's gradient row (fp32) and its int64 index
    assert grad and sum(n.op.bytes for n in grad) <= 2 * rows
    assert not g.unknown_ops()


def test_a_sequence_first_module_reports_its_batch():
    mha = nn.MultiheadAttention(64, 4)  # batch_first=False: (seq, batch, embed)
    x = torch.randn(128, 4, 64)
    assert graph_of(mha, None, mode="inference", inputs=(x, x, x)).meta["batch"] == 4
    first = nn.MultiheadAttention(64, 4, batch_first=True)
    assert graph_of(first, None, mode="inference", inputs=(x, x, x)).meta["batch"] == 128


def test_a_plain_error_in_packing_keeps_torchs_message():
    """Only a packing that needs the lengths' values gets the sorted-list advice: 3 lengths for a
    batch of 4 is the user's own error, and says so with the op it failed in."""
    class Wrong(nn.Module):
        def __init__(self):
            super().__init__()
            self.lstm = nn.LSTM(8, 16, batch_first=True)

        def forward(self, x):
            p = nn.utils.rnn.pack_padded_sequence(x, [5, 4, 3], batch_first=True)
            return nn.utils.rnn.pad_packed_sequence(self.lstm(p)[0], batch_first=True)[0]

    with pytest.raises(KitError) as e:
        capture(Wrong(), (torch.randn(4, 5, 8),), mode="inference")
    assert "Expected `len(lengths)` to be equal to batch_size" in str(e.value)
    assert "Python list" not in str(e.value) and "_pack_padded_sequence" in str(e.value)


def test_a_gemm_with_an_out_dtype_mixes_dtypes_by_design():
    """torch.addmm(fp32 bias, bf16, bf16, out_dtype=fp32) is aten.addmm.dtype, which torch runs:
    the operands' dtype check leaves it alone (it refuses int ids into a float Linear)."""
    class OutDtype(nn.Module):
        def __init__(self):
            super().__init__()
            self.w, self.b = nn.Parameter(torch.randn(64, 64)), nn.Parameter(torch.randn(64))

        def forward(self, x):
            return torch.addmm(self.b.float(), x, self.w, out_dtype=torch.float32)

    g = capture(OutDtype(), (torch.randn(8, 64),), mode="inference", dtype="bf16")
    assert "aten.addmm.dtype" in [n.aten for n in g.nodes]
