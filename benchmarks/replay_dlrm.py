"""Replay the 8-rank DLRM Kineto trace (8x V100-SXM2-32GB, PARAM et_replay inputs) and compare
each rank's replayed ProfilerStep with the measured one. Goal: every rank within 3% (Lumos: 3.3%).
The replay keeps each op's measured launch delay, so the error is small nearly by construction:
it checks the reconstruction (graph, streams, clock offsets), not a prediction.
Then again with the PyTorch execution traces of the same run linked (dlrm_pytorch_et.tar.gz):
how many ops and GPU ops the ET links per rank, and the per-rank errors with the ET's deps.

    .venv/bin/python benchmarks/replay_dlrm.py     # prints JSON
"""
import json
import os
import sys
import time
from pathlib import Path

from kit.trace import replay

SHARED = Path(os.environ.get("KIT_SHARED", Path(__file__).resolve().parents[1].parent / "shared"))
TRACE = SHARED / "data/traces/param/et_replay/tests/inputs/dlrm_kineto.tar.gz"
ET = SHARED / "data/traces/param/et_replay/tests/inputs/dlrm_pytorch_et.tar.gz"


def main():
    if not TRACE.exists():
        print(json.dumps({"error": f"{TRACE} not found (set KIT_SHARED)"}))
        return 1
    t = time.perf_counter()
    r = replay(TRACE, et=False)
    d = r.to_dict()
    out = {"benchmark": "replay_dlrm", "trace": str(TRACE), "ranks": d["ranks"],
           "mean_abs_error_pct": d["mean_abs_error_pct"], "max_abs_error_pct": d["max_abs_error_pct"],
           "goal_max_abs_error_pct": 3.0, "lumos_reported_pct": 3.3,
           "collectives_synced": d["collectives_synced"], "clock_offsets_us": d["clock_offsets_us"],
           "critical_path": d["critical_path"], "seconds": time.perf_counter() - t}
    without = replay(TRACE, sync_collectives=False, et=False).to_dict()
    out["without_inter_rank_sync_mean_abs_error_pct"] = without["mean_abs_error_pct"]
    if ET.exists():
        t = time.perf_counter()
        w = replay(TRACE, et=ET).to_dict()
        out["with_et"] = {
            "et": str(ET), "seconds": time.perf_counter() - t,
            "error_pct": {x["rank"]: x["error_pct"] for x in w["ranks"]},
            "mean_abs_error_pct": w["mean_abs_error_pct"], "max_abs_error_pct": w["max_abs_error_pct"],
            "links": [{k: x[k] for k in ("rank", "et_ops", "linked_ops", "gpu_ops", "gpu_ops_linked",
                                         "gpu_ops_without_launch", "data_edges", "data_edges_cross_thread",
                                         "data_edges_backwards", "gpu_deps",
                                         "sync_deps")} for x in w["execution_traces"]],
            "host_syncs": w["host_syncs"], "gpu_waits": w["gpu_waits"]}
    for on in ("dgx-a100", "dgx-h100"):
        out[f"on_{on}_ms"] = [x["predicted_ms"] for x in replay(TRACE, on=on, et=False).to_dict()["ranks"]]
        if ET.exists():
            out[f"on_{on}_with_et_ms"] = [x["predicted_ms"] for x in
                                          replay(TRACE, on=on, et=ET).to_dict()["ranks"]]
    print(json.dumps(out, indent=2, default=float))
    return 0


if __name__ == "__main__":
    sys.exit(main())
