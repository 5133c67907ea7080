"""benchmarks/element_rates.py on a folder as benchmarks/device_session.sh's tarball unpacks it:
plain `rows_*.csv` (not yet gzipped), rows measured on an H100 (their bandwidth, not the H200's,
says which softmax rows were bound by their bytes), and a run with no softmax row at all."""
from __future__ import annotations

import gzip
import json
import sys
from pathlib import Path

import pandas as pd

from kit.data import schema
from kit.data.op_calls import shape_columns

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import element_rates  # noqa: E402

KERNEL = {"softmax": "softmax_warp_forward", "ln": "vectorized_layer_norm_kernel"}


def _write(path: Path, rows: list[tuple], gpu: str = "h100-sxm", device: str = "NVIDIA H100 80GB HBM3"):
    """Collector rows (op, dtype, rows, cols, kernel_ms) in the kit's schema, as kit collect writes."""
    out = []
    for op, dtype, r, c, ms in rows:
        cls, kind, scalar = schema.op_info(op)
        out.append({"op": op, "op_class": cls, "elem_kind": kind, "scalar": scalar, "gpu": gpu,
                    "device_name": device, "dtype": dtype, **shape_columns(op, (r, c)),
                    "latency_ms": ms * 1.1 if ms == ms else 1.0, "kernel_name": KERNEL.get(op, "elementwise_kernel"),
                    "kernels": KERNEL.get(op, "elementwise_kernel"), "n_kernels": 1, "kernel_ms": ms,
                    "latency_median_ms": ms * 1.2 if ms == ms else 1.0, "source": "collector", "split": "train"})
    frame = pd.DataFrame(out, columns=list(schema.COLUMNS))
    if path.suffix == ".gz":
        with gzip.open(path, "wt", newline="") as f:
            frame.to_csv(f, index=False)
    else:
        frame.to_csv(path, index=False)


def test_the_tarballs_plain_csvs_are_read_and_a_gz_twin_once(tmp_path, capsys):
    session = tmp_path / "session"
    session.mkdir()
    rows = [("add", "bf16", 4096, 3072, 0.05), ("pow", "bf16", 4096, 3072, 0.1),
            ("softmax", "bf16", 65536, 2048, 1.0), ("softmax", "fp32", 65536, 2048, 2.0)]
    _write(session / "rows_opt-1.3b_bf16.csv", rows)
    assert [f.name for f in element_rates.sweep_files(tmp_path)] == ["rows_opt-1.3b_bf16.csv"]
    assert element_rates.main(["--dir", str(tmp_path)]) == 0
    out = json.loads(capsys.readouterr().out)
    assert {(r["op"], r["dtype"]) for r in out["rates"]} == {("add", "bf16"), ("pow", "bf16")}
    assert "pow" in out["bounds"]
    _write(session / "rows_opt-1.3b_bf16.csv.gz", rows)  # gzipped for the commit, the .csv kept
    assert [f.name for f in element_rates.sweep_files(tmp_path)] == ["rows_opt-1.3b_bf16.csv.gz"]
    assert len(element_rates.all_sweep_rows([tmp_path])) == len(rows)


def test_a_softmax_row_is_bytes_bound_by_its_own_gpus_bandwidth(tmp_path):
    session = tmp_path / "session"
    session.mkdir()
    # fp32 softmax of 65536 x 2048: 1.07 GB read and written in 0.37 ms, 2.9 TB/s: 87% of an
    # H100 SXM's 3.35 TB/s (bound by its bytes there), 60% of an H200's 4.8 TB/s
    _write(session / "rows_opt-1.3b_fp32.csv", [("softmax", "fp32", 65536, 2048, 0.37)])
    d = element_rates.softmax_rows([tmp_path])
    assert list(d.gpu) == ["h100-sxm"] and bool(d.bytes_bound.iloc[0])
    _write(session / "rows_opt-1.3b_fp32.csv", [("softmax", "fp32", 65536, 2048, 0.37)], gpu="h200",
           device="NVIDIA H200")
    assert not element_rates.softmax_rows([tmp_path]).bytes_bound.iloc[0]


def test_a_run_stopped_before_its_softmax_rows_is_no_traceback(tmp_path, capsys):
    session = tmp_path / "session"
    session.mkdir()
    _write(session / "rows_gpt2_bf16.csv", [("add", "bf16", 1024, 768, 0.03), ("mul", "bf16", 8192, 3072, 0.05)])
    assert element_rates.main(["--dir", str(tmp_path)]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["softmax"] == [] and out["softmax_bounds"] == {} and out["softmax_held_out"] == {}
    # a CPU dry run's rows have no kernel time: nothing to read, and still no traceback
    _write(session / "rows_gpt2_bf16.csv", [("add", "bf16", 1024, 768, float("nan"))], gpu=None, device="cpu: x")
    assert element_rates.main(["--dir", str(tmp_path)]) == 0
    assert json.loads(capsys.readouterr().out)["rates"] == []
