"""A tiny synthetic measurement table in the kit.data schema, for fast predictor tests.

Latencies follow a known rule, roofline / 0.6 + 6 µs (a GPU-independent utilisation), so a
model that learned utilisation should carry it to a GPU outside the table."""
import numpy as np
import pandas as pd

from kit.data.schema import conform
from kit.hardware import get_gpu
from kit.predict.features import op_from_row
from kit.predict.roofline import roofline

OVERHEAD_MS = 0.006
UTIL = 0.6


def rule_ms(op, gpu) -> float:
    return roofline(op, gpu).time_ms / UTIL + OVERHEAD_MS


def synthetic_frame(gpus=("t4", "v100-pcie-32gb"), n=60, seed=0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    rows = []
    for gpu in gpus:
        for _ in range(n):
            m, nn, k = (int(v) for v in 2 ** rng.uniform(4, 12, 3))
            b = int(rng.integers(1, 8))
            op = "bmm" if rng.random() < 0.5 else "linear"
            tile = (128, 64) if nn >= 512 else (64, 64)
            rows.append(dict(op=op, op_class="gemm", gpu=gpu, dtype="fp32",
                             b=1 if op == "linear" else b, m=m, n=nn, k=k, tile_m=tile[0],
                             tile_n=tile[1], block_x=128 if tile[0] == 128 else 64, block_y=1,
                             block_z=1))
            r, c = (int(v) for v in 2 ** rng.uniform(4, 13, 2))
            kind = ["add", "mul", "relu", "gelu"][int(rng.integers(4))]
            rows.append(dict(op=kind, op_class="elementwise", elem_kind=kind, scalar=False,
                             gpu=gpu, dtype="fp32", rows=r, cols=c))
            rows.append(dict(op="softmax", op_class="softmax", gpu=gpu, dtype="fp32", rows=r, cols=c))
            rows.append(dict(op="ln", op_class="layernorm", gpu=gpu, dtype="fp32", rows=r, cols=c))
    frame = pd.DataFrame(rows)
    frame["latency_ms"] = [rule_ms(op_from_row(r), get_gpu(r["gpu"]))
                           for r in frame.to_dict("records")]
    return conform(frame)
