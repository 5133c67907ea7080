"""Speed of kit.data: loading NeuSight's train-collect rows, and the CPU collector's throughput.

Prints JSON: seconds for the first (uncached, parsing all 80 CSVs) and the cached load of the
256,509 train-collect rows, and measurements per second of a CPU collector run over tiny GEMMs
(each row appended with flush + fsync).

    .venv/bin/python benchmarks/data_load.py
"""
from __future__ import annotations

import json
import os
import tempfile
import time
from pathlib import Path


def main() -> None:
    import torch

    torch.set_num_threads(1)
    from kit.data import load_neusight, resolve_data_dir
    from kit.data.collect import collect
    from kit.data.shapes import resolve_shapes

    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["KIT_CACHE"] = tmp  # a cold cache, so the first load parses the CSVs
        root = resolve_data_dir()
        t0 = time.perf_counter()
        rows = len(load_neusight("train-collect", data_dir=root))
        out["train_collect_rows"] = rows
        out["first_load_s"] = round(time.perf_counter() - t0, 2)
        t0 = time.perf_counter()
        load_neusight("train-collect", data_dir=root)
        out["cached_load_s"] = round(time.perf_counter() - t0, 2)

        shapes = resolve_shapes("tiny-gemm:200")
        t0 = time.perf_counter()
        r = collect("bmm", shapes, Path(tmp) / "m.csv", device="cpu", warmup=1, repeats=3,
                    progress=False)
        seconds = time.perf_counter() - t0
        out["collector_cpu_tiny_bmm"] = {"measured": r["measured"], "seconds": round(seconds, 2),
                                         "per_s": round(r["measured"] / seconds, 1)}
    out["cpu_count"] = os.cpu_count()
    out["load_average_1min"] = round(os.getloadavg()[0], 2)
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
