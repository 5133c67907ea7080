"""Rows of one's own measurements (the kit's collector CSVs, or NeuSight-format ones) to train the
learned predictors on beside NeuSight's data: `kit train --extra PATH`.

    frame, files = own_rows(["measurements/h200-2026-12-04"])

A path is a CSV (or .csv.gz) or a folder, read recursively for them (a folder's CSVs that are no
measurement CSVs, such as nvidia-smi samples, are listed as skipped). Only FP32 rows of the
modelled op classes on a catalog GPU are kept: the tile-MLP's features describe a tile against
the FP32 SIMT peak (kit.predict.features), so a 16-bit or TF32 row would teach it a tensor-core
kernel's speed as an FP32 one's, and a row timed on a CPU describes no GPU. Linear rows timed
without a bias (the collector's meta says so) are left out too: NeuSight's have one. Each file's sha256,
rows kept and rows left out (and why) go into the weights' manifest."""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from kit.errors import KitError, need_path

def _files(path) -> list[Path]:
    """The CSVs a path names: itself, or every one in the folder (recursively)."""
    p = Path(need_path(path, "--extra (a measurement CSV or folder)"))
    if p.is_file():
        return [p]
    if not p.exists():
        raise KitError(f"--extra: {p} not found")
    from kit.data.loading import measurement_files

    found = measurement_files(p)
    if not found:
        raise KitError(f"--extra: no measurement CSVs (*.csv, *.csv.gz) in the folder {p}")
    return found


def own_rows(paths, modelled) -> tuple[pd.DataFrame, list[dict]]:
    """(rows to train on, one record per file read). KitError for a path that holds none."""
    from kit.data import load_measurements
    from kit.data.fetch import sha256_of
    from kit.data.loading import NotMeasurementCSV
    from kit.data.provenance import linear_without_bias
    from kit.hardware import gpu_keys

    parts, files = [], []
    for path in paths:
        in_folder = Path(path).is_dir()
        for f in _files(path):
            try:
                rows = load_measurements(f)
            except NotMeasurementCSV:  # a folder's other CSVs (nvidia-smi samples, sweeps' logs)
                if not in_folder:
                    raise
                files.append({"path": str(f), "skipped": "not a measurement CSV"})
                continue
            ok_class = rows.op_class.isin(list(modelled))
            fp32 = rows.dtype.fillna("fp32") == "fp32"
            on_gpu = rows.gpu.isin(gpu_keys())  # load_measurements made known names keys; others stay as written
            no_bias = (rows.op == "linear") & linear_without_bias(f)
            keep = ok_class & fp32 & on_gpu & (rows.latency_ms > 0) & ~no_bias
            files.append({"path": str(f), "sha256": sha256_of(f), "rows": int(keep.sum()),
                          "left_out": {"not fp32": int((ok_class & ~fp32).sum()),
                                       "linear without a bias": int((ok_class & fp32 & no_bias).sum()),
                                       "not on a catalog GPU": int((ok_class & fp32 & ~on_gpu).sum()),
                                       "op class not modelled": int((~ok_class).sum())}})
            parts.append(rows[keep].assign(split="train", _extra_file=str(f)))
    frame = pd.concat(parts, ignore_index=True) if parts else pd.DataFrame()
    if frame.empty:
        raise KitError("--extra: none of the rows are FP32 GEMM, elementwise, softmax or layer-norm "
                       "rows timed on a catalog GPU (the tile-MLP learns FP32 kernels only)")
    return frame, files
