"""kit.data.configs.label_gemm_shape / label_gemm_nodes: the GEMM nodes of NeuSight's per-node
labels, with their shapes in kit.ops.Gemm's orientation (output m x n, reduction k)."""
import pandas as pd
import pytest

from kit.data.configs import label_gemm_nodes, label_gemm_shape, label_kernel_pairs

LINEAR = ("{'nn_module_stack': OrderedDict([('bert', <class 'x.BertModel'>), "
          "('bert.q', <class 'torch.nn.modules.linear.Linear'>)])}")
NORM = ("{'nn_module_stack': OrderedDict([('bert.ln', "
        "<class 'torch.nn.modules.normalization.LayerNorm'>)])}")


def test_addmm_is_conv1d_with_the_weight_stored_in_by_out():
    got = label_gemm_shape("call_function", "<built-in method addmm of type object>",
                           "[[7680], [4096, 2560], [2560, 7680]]", "(4096, 7680)")
    assert got == ("addmm", 1, 4096, 7680, 2560)


def test_matmul_folds_batch_and_heads():
    got = label_gemm_shape("call_function", "<built-in method matmul of type object>",
                           "[[2, 32, 2048, 80], [2, 32, 80, 2048]]", "(2, 32, 2048, 2048)")
    assert got == ("matmul", 64, 2048, 2048, 80)


def test_linear_module_flattens_the_tokens():
    got = label_gemm_shape("call_module", "bert.q", "[[2, 512, 1024]]", "(2, 512, 3072)", LINEAR)
    assert got == ("linear", 1, 1024, 3072, 1024)


@pytest.mark.parametrize("args", [
    ("call_module", "bert.ln", "[[2, 512, 1024]]", "(2, 512, 1024)", NORM),  # not a GEMM
    ("call_function", "<built-in method addmm>", "not a list", "(1,)", ""),  # malformed shapes
    ("call_function", "<built-in method matmul>", "[[4, 8], [8, 2]]", "(4, 2)", ""),  # 2-d matmul
    ("call_module", "bert.q", "[[2, 512, 1024]]", "garbage", LINEAR),  # unreadable output shape
])
def test_other_nodes_are_none(args):
    assert label_gemm_shape(*args) is None


def test_label_gemm_nodes_keeps_only_gemms_with_their_rows():
    nodes = pd.DataFrame({
        "gpu": ["l4"] * 3, "fx_op": ["call_function", "call_module", "call_module"],
        "target": ["<built-in method addmm>", "bert.q", "bert.ln"],
        "input_shapes": ["[[96], [16, 64], [64, 96]]", "[[2, 8, 96]]", "[[2, 8, 96]]"],
        "output_shape": ["(16, 96)", "(2, 8, 32)", "(2, 8, 96)"],
        "module_stack": ["", LINEAR, NORM], "fw_latency_ms": [0.5, 0.25, 0.1]})
    got = label_gemm_nodes(nodes)
    assert list(got.index) == [0, 1]
    assert list(got.kind) == ["addmm", "linear"]
    assert got[["b", "m", "n", "k"]].values.tolist() == [[1, 16, 96, 64], [1, 16, 32, 96]]
    assert list(got.fw_latency_ms) == [0.5, 0.25]


def test_label_kernel_pairs_takes_the_fastest_kernel_of_the_same_shape():
    nodes = pd.DataFrame({"gpu": ["l4", "l4", "l4", None], "kind": ["addmm", "linear", "addmm", "addmm"],
                          "b": [1, 1, 1, 1], "m": [16, 16, 64, 16], "n": [96, 96, 96, 96],
                          "k": [64, 64, 64, 64], "fw_latency_ms": [0.5, 0.1, 0.9, 0.5]})
    kernels = pd.DataFrame({"gpu": ["l4"] * 3 + ["t4"], "op": ["linear", "linear", "bmm", "linear"],
                            "op_class": ["gemm"] * 4, "b": [1] * 4, "m": [16] * 4, "n": [96] * 4,
                            "k": [64] * 4, "latency_ms": [1.0, 0.8, 0.4, 0.2]})
    # the 0.1 ms node is under min_ms; the 64-row node has no kernel row; the GPU-less node none
    got = label_kernel_pairs(nodes, kernels)
    assert got[["kind", "kernel_ms"]].values.tolist() == [["addmm", 0.4]]
    assert got.ratio.tolist() == pytest.approx([0.5 / 0.4])
    split = label_kernel_pairs(nodes, kernels, by_op=True).sort_values("op")
    assert split[["op", "kernel_ms"]].values.tolist() == [["bmm", 0.4], ["linear", 0.8]]


def _node_csv(folder, name, latency="0.5"):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_text(
        "Name,op,target,input_shapes,output_shape,dtype,latency,fw_latency,bw_latency,acc_latency,meta\n"
        f"mm,call_function,matmul,\"[[2, 4], [4, 8]]\",\"(2, 8)\",float32,{latency},0.3,0.2,0.0,\n")


def test_a_label_folder_named_like_a_csv_is_no_traceback(tmp_path):
    """A folder named *.csv under label/<GPU>/ had raised IsADirectoryError."""
    from kit.data.configs import load_label_nodes

    gpu = tmp_path / "NVIDIA_A100-PCIE-40GB"
    _node_csv(gpu, "gpt2-train-512-2.csv")
    (gpu / "old.csv").mkdir()
    nodes = load_label_nodes(labels_dir=tmp_path)
    assert len(nodes) == 1 and nodes.latency_ms.iloc[0] == 0.5


def test_text_in_a_label_latency_is_named(tmp_path):
    """Text in a latency column had loaded as text and raised a TypeError in label_kernel_pairs."""
    from kit.data.configs import load_label_nodes
    from kit.errors import KitError

    _node_csv(tmp_path / "NVIDIA_A100-PCIE-40GB", "gpt2-train-512-2.csv", latency="fast")
    with pytest.raises(KitError, match=r"gpt2-train-512-2\.csv:2: column 'latency' .*'fast'"):
        load_label_nodes(labels_dir=tmp_path)


def test_a_label_csv_that_cannot_be_read_is_named_not_skipped(tmp_path):
    """A *.csv link to a file that is gone had been skipped without a word (is_file is false for
    it), its GPU's nodes silently lost from the labels."""
    from kit.data.configs import load_label_nodes
    from kit.errors import KitError

    gpu = tmp_path / "NVIDIA_A100-PCIE-40GB"
    _node_csv(gpu, "gpt2-train-512-2.csv")
    (gpu / "gpt2-train-512-4.csv").symlink_to(tmp_path / "gone.csv")
    with pytest.raises(KitError, match=r"cannot read label CSV .*gpt2-train-512-4\.csv"):
        load_label_nodes(labels_dir=tmp_path)
