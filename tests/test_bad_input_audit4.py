"""Fourth bad-input audit (fuzzing every command and kit.api entry with bad values and option
combinations): each problem found is one KitError, never a traceback or a silently wrong number."""
import pytest

from kit import api
from kit.errors import KitError


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("KIT_CACHE", str(tmp_path / "cache"))

TINY_GPT = {"model_type": "gpt2", "n_embd": 64, "n_head": 2, "n_layer": 1, "n_positions": 64,
            "vocab_size": 128}


# -- 1. inputs= with a model the kit builds itself ---------------------------------------------
@pytest.mark.parametrize("model", ["gpt2", TINY_GPT])
def test_inputs_with_a_zoo_name_or_config_is_refused(model):
    """The kit makes a zoo model's or config's token ids from batch and seq: inputs of batch 8 and
    128 tokens had been dropped without a word, and gpt2 priced at batch 1, 1024 tokens."""
    import torch

    with pytest.raises(KitError, match="inputs= goes with an nn.Module"):
        api.predict_model(model, "h100-sxm", mode="inference",
                          inputs=(torch.zeros(8, 128, dtype=torch.long),))


def test_inputs_with_a_callable_that_brings_its_own_are_refused():
    """(review) A callable returning (module, inputs) had its inputs win over inputs= without a
    word: a Linear(256, 256) priced 0.02431 ms with its own batch of 2 whether or not inputs of
    batch 4096 (0.04445 ms when given with the bare module) were passed."""
    import torch

    def make():
        return torch.nn.Linear(256, 256), (torch.zeros(2, 256),)

    with pytest.raises(KitError, match="gave \\(module, inputs\\)"):
        api.predict_model(make, "h100-sxm", mode="inference", inputs=(torch.zeros(4096, 256),))
    bare = api.predict_model(torch.nn.Linear(256, 256), "h100-sxm", mode="inference",
                             inputs=(torch.zeros(4096, 256),))
    assert bare.total_ms > api.predict_model(make, "h100-sxm", mode="inference").total_ms


# -- 2. a measured time past an hour ----------------------------------------------------------
def _kit_row_csv(path, latency):
    from kit.data.records import HEADER

    row = {"op": "bmm", "op_class": "gemm", "scalar": "false", "gpu": "p4", "device_name": "Tesla P4",
           "dtype": "fp32", "b": "2", "m": "8", "n": "8", "k": "8", "latency_ms": latency,
           "source": "collector", "split": "train"}
    path.write_text(",".join(HEADER) + "\n" + ",".join(str(row.get(c, "")) for c in HEADER) + "\n")
    return path


@pytest.mark.parametrize("latency", ["1e300", "3600000.5"])
def test_a_time_past_an_hour_is_refused_in_either_format(tmp_path, latency):
    """NeuSight's longest row is 12,297 ms; a time past an hour (3.6e6 ms) is a unit slip or a
    corrupt cell. 1e300 ms had been read, scored (APE 100%) and trained on (kit train --extra)."""
    neusight = tmp_path / "n.csv"
    neusight.write_text(f"OPName,Latency,Device,B,M,N,K\nbmm,{latency},Tesla V100-PCIE-32GB,1,64,64,64\n")
    with pytest.raises(KitError, match="the most 3.6e\\+06 ms"):
        api.evaluate_predictors(str(neusight), "roofline")
    with pytest.raises(KitError, match="the most 3.6e\\+06 ms"):
        api.evaluate_predictors(str(_kit_row_csv(tmp_path / "k.csv", latency)), "roofline")


def test_train_extra_with_a_time_past_an_hour_fails_before_training(tmp_path):
    with pytest.raises(KitError, match="the most 3.6e\\+06 ms"):
        api.train_predictors("P4", tmp_path / "w", quick=True,
                             extra=str(_kit_row_csv(tmp_path / "k.csv", "1e300")))
    assert not (tmp_path / "w").exists()


def test_an_hour_itself_is_still_taken(tmp_path):
    neusight = tmp_path / "n.csv"
    neusight.write_text("OPName,Latency,Device,B,M,N,K\nbmm,3600000,Tesla V100-PCIE-32GB,1,64,64,64\n")
    (row,) = api.evaluate_predictors(str(neusight), "roofline")
    assert row["n"] == 1


# -- 3. --resume of a file with no newline at all ----------------------------------------------
TINY_SWEEPS = [  # the two collectors that append to a CSV, each on one or two tiny cases on the CPU
    ["collect", "--ops", "gemm", "--shapes", "tiny-gemm:1", "--device", "cpu", "--repeats", "1",
     "--warmup", "0"],
    ["collect-embedding", "--batch", "2", "--rows", "10", "--dim", "4", "--pooling", "2",
     "--repeats", "1", "--warmup", "0"],
]


@pytest.mark.parametrize("argv", TINY_SWEEPS)
def test_resume_of_a_file_with_no_newline_and_no_header_of_ours_leaves_it(tmp_path, capsys, argv):
    """A file of 150 bytes of control characters (UTF-8, no newline) had been taken for a cut
    header: dropped as "an unfinished last line" and written over with a fresh CSV."""
    from cli_support import one_error_line

    out = tmp_path / "mine.csv"
    out.write_bytes(b"\x00\x01\x02" * 50)
    assert "is not" in one_error_line(capsys, [*argv, "--out", str(out), "--resume"])
    assert out.read_bytes() == b"\x00\x01\x02" * 50


@pytest.mark.parametrize("argv, header_of", [
    (["collect", "--ops", "gemm", "--shapes", "tiny-gemm:1", "--device", "cpu", "--repeats", "1",
      "--warmup", "0", "--force"], "kit.data.records.HEADER"),  # --force: no FILE.meta.json
    (["collect-embedding", "--batch", "2", "--rows", "10", "--dim", "4", "--pooling", "2",
      "--repeats", "1", "--warmup", "0"], "kit.embedding.measured_rows.COLUMNS"),
])
def test_resume_of_a_cut_header_still_writes_it_again(tmp_path, argv, header_of):
    import importlib

    from kit.cli import main

    mod, name = header_of.rsplit(".", 1)
    header = ",".join(getattr(importlib.import_module(mod), name))
    out = tmp_path / "cut.csv"
    out.write_text(header[:7])  # a run killed while writing its header
    assert main([*argv, "--out", str(out), "--resume"]) == 0
    assert out.read_text().splitlines()[0] == header


# -- 4. collect-embedding lists with an empty item ---------------------------------------------
@pytest.mark.parametrize("flag, value", [("--batch", "1,,2"), ("--rows", "10,,20"), ("--mode", "sum,,mean"),
                                         ("--dtype", "fp32,,fp16"), ("--dist", "uniform;;zipf:1.05")])
def test_collect_embedding_empty_item_between_separators_is_one_line(tmp_path, capsys, flag, value):
    """As `kit comm predict --sizes 1K,,2K` is refused: a value between the two was lost. They had
    been measured as if it were not there."""
    from cli_support import one_error_line

    out = tmp_path / "e.csv"
    assert "empty item" in one_error_line(capsys, ["collect-embedding", "--out", str(out), flag, value])
    assert not out.exists()


def test_collect_embedding_trailing_comma_is_still_taken():
    from kit.cli.cmd_collect_embedding import _dists, _ints

    assert _ints("1,2,", "--batch") == [1, 2]
    assert _dists("uniform;reuse:0.5,0.2;") == ["uniform", "reuse:0.5,0.2"]


# -- 5. the other comma lists: an empty item between commas ------------------------------------
@pytest.mark.parametrize("argv", [
    ["evaluate", "--test", "T", "--predictors", "roofline,,wave"],
    ["train", "--train-gpus", "P4,,T4", "--out", "OUT"],
    ["collect", "--device", "cpu", "--ops", "bmm,,linear", "--shapes", "tiny-gemm:1", "--out", "OUT"],
    ["collect-comm", "--collectives", "allreduce,,allgather", "--sizes", "1K:2K", "--out", "OUT"],
    ["shard", "--system", "dgx-h100", "--tables", "TABLES", "--kinds", "tw,,rw"],
])
def test_an_empty_item_between_commas_is_one_line(tmp_path, capsys, argv):
    """kit compare --gpus and kit validate --models refused "a,,b"; these five had dropped the
    lost name and run (kit train began a 992-epoch training on P4 and T4)."""
    from cli_support import one_error_line

    test = tmp_path / "t.csv"
    test.write_text("OPName,Latency,Device,B,M,N,K\nbmm,0.1,Tesla V100-PCIE-32GB,1,64,64,64\n")
    tables = tmp_path / "tables.csv"
    tables.write_text("name,rows,dim,pooling\nt0,1000,64,8\n")
    out = tmp_path / "out"
    swap = {"T": str(test), "TABLES": str(tables), "OUT": str(out)}
    assert "empty item between commas" in one_error_line(capsys, [swap.get(a, a) for a in argv])
    assert not out.exists()


def test_api_kinds_and_predictors_with_an_empty_item_are_refused():
    from kit.embedding import Table

    with pytest.raises(KitError, match="empty item between commas"):
        api.shard_tables([Table(rows=1000, dim=64, pooling=8, name="t")], "dgx-h100", kinds="tw,,rw")
    with pytest.raises(KitError, match="empty item between commas"):
        api.evaluate_predictors("unused.csv", "roofline,,wave")


# -- 6. (review) an fp8 op torch has no kernel for ----------------------------------------------
ROW_OPS_FP8 = [  # (kit op, torch's own call on the same data): torch is the judge, not the kit
    ("layernorm", lambda F, x: F.layer_norm(x, (x.shape[-1],))),
    ("softmax", lambda F, x: F.softmax(x, -1)),
    ("rmsnorm", lambda F, x: F.rms_norm(x, (x.shape[-1],))),
    ("dropout", lambda F, x: F.dropout(x, 0.1, True)),
]


@pytest.mark.parametrize("kind, torch_call", ROW_OPS_FP8, ids=[k for k, _ in ROW_OPS_FP8])
def test_an_fp8_row_op_torch_cannot_run_is_refused(kind, torch_call):
    """`kit op layernorm --dtype fp8` had priced a kernel torch does not have (0.02877 ms on an
    h100-sxm for 4096x4096; 0.04813 ms on an A100, which has no fp8 at all), where kit op gemm
    --dtype fp8 on the A100 was refused."""
    import torch
    import torch.nn.functional as F

    from kit import ops

    x = torch.ones(4, 8).to(torch.float8_e4m3fn)
    with pytest.raises((RuntimeError, NotImplementedError, TypeError)):
        torch_call(F, x)  # torch itself has no fp8 kernel for it
    op = ops.Dropout(64, "fp8") if kind == "dropout" else {
        "layernorm": ops.LayerNorm, "softmax": ops.Softmax, "rmsnorm": ops.RMSNorm}[kind](8, 64, "fp8")
    for gpu in ("h100-sxm", "a100-sxm4-80gb"):
        with pytest.raises(KitError, match=f"{kind} has no fp8 kernel in torch"):
            api.predict_op(op, gpu)
        with pytest.raises(KitError, match=f"{kind} has no fp8 kernel in torch"):
            api.op_tiling(op, gpu)  # its tiles, as kit op prints them


def test_fp8_row_op_on_the_command_line_is_one_line(capsys):
    from cli_support import one_error_line

    line = one_error_line(capsys, ["op", "layernorm", "--rows", "4096", "--cols", "4096",
                                   "--gpu", "a100-sxm4-80gb", "--dtype", "fp8"])
    assert "layernorm has no fp8 kernel" in line


def test_fp8_gemm_and_byte_elementwise_are_still_priced():
    from kit import ops

    assert api.predict_op(ops.Gemm(m=256, n=256, k=256, dtype="fp8"), "h100-sxm")["latency_ms"] > 0
    assert api.predict_op(ops.Elementwise("add", 1 << 20, "fp8"), "h100-sxm")["latency_ms"] > 0
    assert api.predict_op(ops.LayerNorm(8, 64, "bf16"), "a100-sxm4-80gb")["latency_ms"] > 0


# -- 7. (review) --resume of a file that is not there -------------------------------------------
@pytest.mark.parametrize("argv", TINY_SWEEPS)
def test_resume_of_a_missing_file_says_it_starts_anew(tmp_path, capsys, argv):
    """A mistyped --out with --resume had measured the whole sweep again without a word until its
    last line ('0 already in'). It still runs (a requeued job passes --resume on its first run
    too), but says so before measuring; a second --resume of the file it wrote says nothing."""
    from kit.cli import main

    out = tmp_path / "runs" / "typo.csv"
    assert main([*argv, "--out", str(out), "--resume"]) == 0
    err = capsys.readouterr().err
    assert f"--resume: {out} does not exist" in err and "kit: note:" in err
    assert main([*argv, "--out", str(out), "--resume"]) == 0
    assert "--resume" not in capsys.readouterr().err


# -- 8. (review) a whole-model label past an hour ---------------------------------------------
def test_a_label_past_an_hour_is_refused_and_an_hour_is_taken(tmp_path, capsys):
    """Item 2's cap was on op rows only: kit validate had scored a label's e2e_latency of 1e300
    ms (APE 100.0%, exit 0). NeuSight's longest label is 7,480 ms (A100-PCIe, gpt3_xl-inf-2048-8)."""
    import json

    from cli_support import one_error_line

    from kit.data.configs import label_e2e_ms

    label = tmp_path / "labels" / "NVIDIA_H100_80GB_HBM3" / "gpt2-inf-512-1.json"
    label.parent.mkdir(parents=True)
    label.write_text(json.dumps({"num_layer": 12, "e2e_latency": 1e300}))
    assert "the most 3.6e+06 ms" in one_error_line(capsys, ["validate", "--labels", str(label.parent.parent)])
    with pytest.raises(ValueError, match="the most 3.6e"):
        label_e2e_ms({"e2e_latency": 3_600_000.5})
    assert label_e2e_ms({"e2e_latency": 3_600_000}) == 3_600_000.0  # an hour itself


# -- 9. (review) kit validate --models as the other name lists ----------------------------------
def test_validate_models_takes_a_trailing_comma_and_refuses_an_empty_item(tmp_path, capsys):
    """Every name list takes "a," as a and refuses "a,,b" (comma_names); kit validate --models had
    split by hand: "gpt2," was 'unknown model '''."""
    import json

    from cli_support import one_error_line

    from kit.cli import main

    label = tmp_path / "labels" / "NVIDIA_H100_80GB_HBM3" / "gpt2-inf-512-1.json"
    label.parent.mkdir(parents=True)
    label.write_text(json.dumps({"num_layer": 12, "e2e_latency": 7.0}))
    labels = str(label.parent.parent)
    assert main(["validate", "--labels", labels, "--models", "gpt2,", "--json"]) == 0
    assert [c["model"] for c in json.loads(capsys.readouterr().out)["configs"]] == ["gpt2"]
    assert "empty item between commas" in one_error_line(
        capsys, ["validate", "--labels", labels, "--models", "gpt2,,bert-large"])
    assert "--models is empty" in one_error_line(capsys, ["validate", "--labels", labels, "--models", ","])
