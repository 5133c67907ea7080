"""The NeuSight loader: a small hand-made layout (exact values), then the real shared data (counts)."""
import csv
import json
import os
import time
from pathlib import Path

import pandas as pd
import pytest

from kit.data import load_device_configs, load_labels, load_measurements, load_model_configs
from kit.data import load_neusight, schema
from kit.data.configs import load_label_nodes, parse_label_name
from kit.errors import KitError

REPO = Path(__file__).resolve().parents[1]
NEUSIGHT = Path(os.environ.get("KIT_DATA", REPO.parent / "shared" / "data" / "neusight"))
shared = pytest.mark.skipif(not (NEUSIGHT / "data" / "dataset").is_dir(),
                            reason="NeuSight shared data not present")

HEAD = ("OPName,Latency,Device,Torch Version,CUDNN Version,Kernel Name,Warps per SM,Blocks per SM,"
        "Grid x,Grid y,Grid z,Block x,Block y,Block z,CUDA Version")
BMM = [HEAD + ",Kernels,B,M,N,K",
       "bmm,0.0357,NVIDIA A100-PCIE-40GB,p2.1.0,8902,ampere_sgemm_128x128_nn,1.77,0.22,4,1,6,256,1,1,"
       "cu121,;ampere_sgemm_128x128_nn,6,27,21,390",
       "bmm,0.0323,NVIDIA A100-PCIE-40GB,p2.1.0,8902,ampere_sgemm_128x64_tn,4.14,0.51,4,1,14,256,1,1,"
       "cu121,;splitk_prep;ampere_sgemm_128x64_tn,14,21,16,392"]
LINEAR = [HEAD + ",Kernels,B,M,N,K",
          "linear,0.0545,NVIDIA A100-PCIE-40GB,p2.1.0,8902,ampere_sgemm_32x128_tn,0.37,0.04,5,1,1,256,1,1,"
          "cu121,;ampere_sgemm_32x128_tn,2,58,13,141"]
ADDU = [HEAD + ",B,H",
        'addu,0.0245,Tesla T4,p2.1.0,8902,"void at::native::vectorized_elementwise_kernel<4, '
        'at::native::CUDAFunctorOnSelf_add<float>, at::detail::Array<char*, 2> >(int)",1.55,0.38,42,1,1,'
        '128,1,1,cu121,127,168']
CONV = [HEAD + ",Kernels,B,Input_Channel,Output_Channel,Kernel_Szie,Input_Size,Stride,Padding",
        'conv,0.96,NVIDIA A100 80GB PCIe,p2.1.0,8902,"void implicit_convolve_sgemm<float, float, 128, 5>()",'
        '6.1,3.05,30,11,1,8,8,1,cu121,";void implicit_convolve_sgemm<float, float, 128, 5>()",38,893,326,3,5,1,1']


def write(path: Path, lines):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture
def layout(tmp_path, monkeypatch):
    monkeypatch.setenv("KIT_CACHE", str(tmp_path / "cache"))
    root = tmp_path / "neusight"
    collect = root / "data" / "dataset" / "train" / "collect"
    write(collect / "bmm" / "p2.1.0" / "NVIDIA A100-PCIE-40GB.csv", BMM)
    write(collect / "linear" / "p2.1.0" / "NVIDIA A100-PCIE-40GB.csv", LINEAR)
    write(collect / "addu" / "p2.1.0" / "Tesla T4.csv", ADDU)
    write(collect / "conv" / "p2.1.0" / "NVIDIA A100 80GB PCIe.csv", CONV)
    return root


def test_hand_made_layout_maps_to_the_schema(layout):
    d = load_neusight("train-collect", data_dir=layout)
    schema.check(d)
    assert len(d) == 5
    bmm = d[d.op == "bmm"].iloc[0]
    # NeuSight bmm (B×M×N)·(B×N×K) with B,M,N,K = 6,27,21,390: kit k (reduction) = 21, n = 390
    assert (bmm.b, bmm.m, bmm.k, bmm.n) == (6, 27, 21, 390)
    assert (bmm.tile_m, bmm.tile_n) == (128, 128) and pd.isna(bmm.tile_k)
    assert (bmm.grid_x, bmm.grid_y, bmm.grid_z, bmm.block_x) == (4, 1, 6, 256)
    assert bmm.gpu == "a100-pcie-40gb" and bmm.op_class == "gemm" and bmm["dtype"] == "fp32"
    assert bmm.latency_ms == pytest.approx(0.0357)
    assert (bmm.torch_version, bmm.cuda_version, bmm.cudnn_version) == ("2.1.0", "12.1", "8902")
    assert bmm.source == "neusight:train-collect" and bmm.split == "train"
    two = d[d.op == "bmm"].iloc[1]
    assert two.kernels == "splitk_prep;ampere_sgemm_128x64_tn" and two.n_kernels == 2
    lin = d[d.op == "linear"].iloc[0]
    # nn.Linear(13, 141) on a (2, 58, 13) input: m = 2*58 rows, k = 13, n = 141
    assert (lin.b, lin.m, lin.k, lin.n) == (1, 116, 13, 141)
    add = d[d.op == "addu"].iloc[0]
    assert (add.rows, add.cols) == (127, 168) and pd.isna(add.m)
    assert add.elem_kind == "add" and bool(add.scalar) and add.gpu == "t4"
    assert pd.isna(add.kernels) and pd.isna(add.tile_m)
    conv = d[d.op == "conv"].iloc[0]
    assert (conv.b, conv.in_channels, conv.out_channels, conv.kernel_size, conv.input_size,
            conv.stride, conv.padding) == (38, 893, 326, 3, 5, 1, 1)
    assert conv.gpu == "a100-pcie-80gb" and pd.isna(conv.rows)


def test_filters(layout):
    assert set(load_neusight(data_dir=layout, ops="gemm").op) == {"bmm", "linear"}
    assert list(load_neusight(data_dir=layout, ops=["addu"]).op) == ["addu"]
    assert set(load_neusight(data_dir=layout, gpus="Tesla T4").gpu) == {"t4"}
    with pytest.raises(KitError, match="'matmul'"):
        load_neusight(data_dir=layout, ops="matmul")


def test_cache_is_used_and_invalidated(layout, tmp_path):
    first = load_neusight(data_dir=layout)
    cached = list((tmp_path / "cache").glob("neusight-train-collect--*.parquet"))
    assert len(cached) == 1
    pd.testing.assert_frame_equal(load_neusight(data_dir=layout), first)
    f = layout / "data/dataset/train/collect/addu/p2.1.0/Tesla T4.csv"
    write(f, ADDU + [ADDU[1].replace("127,168", "5,7")])
    os.utime(f, ns=(time.time_ns(), time.time_ns() + 10**9))
    again = load_neusight(data_dir=layout)
    assert len(again) == len(first) + 1
    assert len(list((tmp_path / "cache").glob("neusight-train-collect--*.parquet"))) == 1


def test_parts_keep_their_own_cache(layout, tmp_path):
    write(layout / "data/dataset/train/elem.csv", [HEAD + ",B,H,large", ADDU[1] + ",True"])
    load_neusight("train-collect", data_dir=layout)
    train = load_neusight("train", data_dir=layout)
    assert sorted(train.op) == ["addu", "bmm", "bmm", "linear"]  # elem.csv + collect bmm/linear
    for part in ("train-collect", "train"):
        assert len(list((tmp_path / "cache").glob(f"neusight-{part}--*.parquet"))) == 1


def test_filtered_loads_skip_files_they_do_not_need(layout):
    write(layout / "data/dataset/train/collect/linear/p2.1.0/NVIDIA A100-PCIE-40GB.csv", ["garbage"])
    assert load_neusight(data_dir=layout, ops="addu").op.tolist() == ["addu"]
    assert set(load_neusight(data_dir=layout, gpus="t4").op) == {"addu"}
    assert load_neusight(data_dir=layout, ops="ln").empty
    with pytest.raises(KitError, match="not a NeuSight CSV"):
        load_neusight(data_dir=layout, ops="gemm")


def test_missing_data_dir_is_a_clear_error(tmp_path):
    with pytest.raises(KitError, match="NeuSight data not found.*KIT_DATA"):
        load_neusight(data_dir=tmp_path / "nope")


def test_unknown_device_is_named(layout):
    write(layout / "data/dataset/train/collect/addu/p2.1.0/Tesla T4.csv",
          ADDU + [ADDU[1].replace("Tesla T4", "Tesla Q9000")])
    with pytest.raises(KitError, match="'Tesla Q9000' in .*Tesla T4.csv is not in the GPU catalog"):
        load_neusight(data_dir=layout)
    # the remedy it names lasts beyond one process: --gpu-file on the command that reads the data
    with pytest.raises(KitError, match="--gpu-file FILE"):
        load_neusight(data_dir=layout)


@pytest.mark.parametrize("lines,message", [
    ([HEAD.replace("Latency,", "") + ",B,H"], "missing column.*Latency"),
    ([HEAD + ",B", ADDU[1].rsplit(",", 1)[0]], "addu rows need column.*H"),
    ([HEAD + ",B,H", ADDU[1].replace("0.0245", "fast")], r"T4.csv:2: Latency must be a positive"),
    ([HEAD + ",B,H", ADDU[1].replace("0.0245", "-1")], "Latency must be a positive"),
    ([HEAD + ",B,H", ADDU[1].replace("127,168", "127,1.5")], r"T4.csv:2: column 'H' must hold a positive whole number, got '1.5'"),
    ([HEAD + ",B,H", ADDU[1], ADDU[1].replace("127,168", "0,168")], r"T4.csv:3: column 'B' must hold a positive whole number, got '0'"),
    ([HEAD + ",B,H", ADDU[1].replace("addu,", "matmul,")], "unknown op.*'matmul'"),
    ([], "is empty"),
    ([HEAD + ",B,H", ADDU[1].replace("Tesla T4", "")], r"T4.csv:2: Device is empty"),
])
def test_malformed_files_are_clear_errors(layout, lines, message):
    f = layout / "data/dataset/train/collect/addu/p2.1.0/Tesla T4.csv"
    f.write_text("\n".join(lines) + ("\n" if lines else ""))
    with pytest.raises(KitError, match=message):
        load_neusight(data_dir=layout)


def test_load_measurements_detects_neusight_format(layout):
    d = load_measurements(layout / "data/dataset/train/collect/bmm/p2.1.0/NVIDIA A100-PCIE-40GB.csv")
    assert len(d) == 2 and d.k.tolist() == [21, 16]


def test_load_measurements_rejects_other_csvs(tmp_path):
    f = write(tmp_path / "x.csv", ["a,b", "1,2"])
    with pytest.raises(KitError, match="missing column.*op, latency_ms"):
        load_measurements(f)
    with pytest.raises(KitError, match="not found"):
        load_measurements(tmp_path / "none.csv")


def test_labels_of_a_hand_made_layout(tmp_path):
    gpu_dir = tmp_path / "label" / "NVIDIA_A100-SXM4-40GB"
    gpu_dir.mkdir(parents=True)
    (gpu_dir / "gpt2_large-train-1024-4-dp4.json").write_text(json.dumps(
        {"num_layer": 36, "e2e_latency": 812.5, "fw_latency": 0, "bwall_latency": 0}))
    (gpu_dir / "bert_large-inf-512-8.json").write_text(json.dumps(
        {"num_layer": None, "e2e_latency": 100.0, "fw_latency": 100.0, "bwall_latency": 0}))
    labels = load_labels(tmp_path).sort_values("model").reset_index(drop=True)
    assert labels.model.tolist() == ["bert_large", "gpt2_large"]
    assert labels.gpu.tolist() == ["a100-sxm4-40gb"] * 2
    dp = labels.iloc[1]
    assert (dp["mode"], dp.seq, dp.batch, dp.option, dp.num_gpus, dp.num_layer) == ("train", 1024, 4, "dp4", 4, 36)
    assert pd.isna(labels.iloc[0].option) and pd.isna(labels.iloc[0].num_layer)
    (gpu_dir / "oops.json").write_text(json.dumps(
        {"num_layer": 1, "e2e_latency": 1.0, "fw_latency": 1.0, "bwall_latency": 0}))
    with pytest.raises(KitError, match="oops.json: name must be <model>-"):
        load_labels(tmp_path)
    (gpu_dir / "oops.json").write_text("{}")
    (gpu_dir / "oops.json").rename(gpu_dir / "opt-inf-8-1.json")
    with pytest.raises(KitError, match="opt-inf-8-1.json: missing key"):
        load_labels(tmp_path)


def test_label_name_parsing():
    assert parse_label_name("gpt3_27-inf-2048-8-fusion") == {
        "model": "gpt3_27", "mode": "inf", "seq": 2048, "batch": 8, "option": "fusion", "num_gpus": 1}
    assert parse_label_name("gpt2_large-train-1024-4-pp4_1")["num_gpus"] == 4


# ---- the real shared data ------------------------------------------------------------------

def _csv_rows(path: Path) -> int:
    """Reference count with the csv module (quoted multi-field kernel lists included)."""
    with open(path, newline="") as f:
        return sum(1 for _ in csv.reader(f)) - 1


@shared
def test_train_collect_has_every_row():
    files = sorted((NEUSIGHT / "data/dataset/train/collect").glob("*/*/*.csv"))
    per_file = {(f.parts[-3], f.stem): _csv_rows(f) for f in files}
    assert sum(per_file.values()) == 256509  # the README's count, conv included
    d = load_neusight("train-collect", data_dir=NEUSIGHT)
    assert len(d) == 256509
    schema.check(d)
    assert set(d.op) == set(schema.OPS)
    assert set(d.gpu) == {"p4", "p100-pcie-16gb", "t4", "v100-pcie-32gb", "a100-pcie-40gb", "a100-pcie-80gb"}
    assert d.groupby(["op", "device_name"]).size().to_dict() == per_file
    gemm = d[d.op_class == "gemm"]
    assert gemm[["b", "m", "n", "k"]].notna().all().all() and (gemm.latency_ms > 0).all()
    assert gemm.tile_m.notna().mean() > 0.95  # almost every sgemm names its tile
    vec = d[d.op_class.isin(["elementwise", "softmax", "layernorm"])]
    assert vec[["rows", "cols"]].notna().all().all() and vec.m.isna().all()


@shared
def test_cached_train_collect_loads_fast():
    load_neusight("train-collect", data_dir=NEUSIGHT)  # fills the cache if needed
    t0 = time.perf_counter()
    d = load_neusight("train-collect", data_dir=NEUSIGHT)
    assert time.perf_counter() - t0 < 10
    assert len(d) == 256509


@shared
def test_first_bmm_row_matches_the_file():
    f = NEUSIGHT / "data/dataset/train/collect/bmm/p2.1.0/Tesla T4.csv"
    with open(f, newline="") as fh:
        first = next(csv.DictReader(fh))
    d = load_measurements(f)
    row = d.iloc[0]
    assert (row.b, row.m, row.k, row.n) == tuple(int(first[c]) for c in ("B", "M", "N", "K"))
    assert row.latency_ms == float(first["Latency"]) and row.kernel_name == first["Kernel Name"]


@shared
def test_test_part_holds_the_held_out_gpus():
    d = load_neusight("test", data_dir=NEUSIGHT)
    assert {"a100-pcie-80gb", "l4"} <= set(d.gpu)
    assert set(d.split) == {"test"}
    files = [NEUSIGHT / f"data/dataset/test/{n}.csv" for n in ("bmm", "linear", "elem", "ln", "softmax")]
    assert len(d) == sum(_csv_rows(f) for f in files)


@shared
def test_other_parts_load():
    for part, kw, gpus in (("train", {"gpus": "p4"}, {"p4"}),
                           ("amd-train-collect", {"ops": "softmax"}, {"mi100", "mi210"}),
                           ("amd-train", {}, {"mi100", "mi210"}), ("amd-test", {}, {"mi100", "mi210"})):
        d = load_neusight(part, data_dir=NEUSIGHT, **kw)
        assert set(d.gpu) == gpus and len(d) > 1000, part
    amd = load_neusight("amd-test", data_dir=NEUSIGHT)
    assert set(amd.torch_version) == {"2.4.1"} and amd.tile_m.notna().all()
    train_p4 = load_neusight("train", data_dir=NEUSIGHT, gpus="p4")
    # the large-shape subsets (elem, ln, softmax) plus P4's collect bmm and linear files
    files = [NEUSIGHT / "data/dataset/train/collect/bmm/p2.1.0/Tesla P4.csv",
             NEUSIGHT / "data/dataset/train/collect/linear/p2.1.0/Tesla P4.csv"]
    subsets = pd.concat([pd.read_csv(NEUSIGHT / f"data/dataset/train/{n}.csv", usecols=["Device"])
                         for n in ("elem", "ln", "softmax")])
    assert len(train_p4) == sum(_csv_rows(f) for f in files) + int((subsets.Device == "Tesla P4").sum())


@shared
def test_labels_configs_devices():
    labels = load_labels(NEUSIGHT)
    assert len(labels) == len(list((NEUSIGHT / "label").glob("*/*.json")))
    assert (labels.e2e_latency_ms > 0).all()
    assert {"l4", "a100-pcie-80gb", "a100-sxm4-40gb", "mi210"} <= set(labels.gpu)
    assert set(labels[labels.num_gpus == 4].option) == {"dp4", "tp4", "pp4_1"}
    models = load_model_configs(NEUSIGHT)
    assert models["gpt2_large"]["n_embd"] == 1280
    devices = load_device_configs(NEUSIGHT)
    l4 = devices[devices.config == "NVIDIA_L4"].iloc[0]
    assert (l4.gpu, l4.sm_count, l4.mem_bw_gbs) == ("l4", 60, 300)
    nodes = load_label_nodes(NEUSIGHT)
    assert len(nodes) > 1000 and (nodes.fw_latency_ms >= 0).all()
