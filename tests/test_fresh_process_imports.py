"""A fresh process's first collective loads no numpy (nor pandas, nor torch): `kit comm predict`
and kit.comm's predict_collective on a preset had spent 0.1 s of a 0.19 s process importing numpy
for isinstance checks and a one-element array (benchmarks/fresh_process.py)."""
import subprocess
import sys

HEAVY = ("numpy", "pandas", "torch", "scipy")


def _loaded(code: str) -> list[str]:
    code += f"\nprint([m for m in {HEAVY!r} if m in sys.modules])"
    out = subprocess.run([sys.executable, "-c", "import sys\n" + code], capture_output=True, text=True, check=True)
    return eval(out.stdout.strip().splitlines()[-1])


def test_a_presets_collectives_import_no_numpy():
    # NVSwitch, two nodes, and a subgroup: ring, tree and NVLS plans; a result with notes
    code = ("from kit.comm import predict_collective\n"
            "r = predict_collective('allreduce', 1e9, 'dgx-h100')\n"
            "predict_collective('allgather', 1e6, 'dgx-h100-x4', [0, 1, 8, 9])\n"
            "predict_collective('reducescatter', 1001, 'dgx-h100-x2', 16, nccl_tests=True)\n"
            "predict_collective('sendrecv', 4e6, 'dgx-h100-x2', [0, 8])\n"
            "print(r.time_ms > 0)")
    assert _loaded(code) == []


def test_kit_comm_predict_on_the_command_line_imports_no_numpy():
    code = ("from kit.cli import main\n"
            "assert main(['comm', 'predict', 'allreduce', '--bytes', '1e9', '--system', 'dgx-h100', '--json']) == 0")
    assert _loaded(code) == []


def test_numpy_values_still_checked_as_before():
    import numpy as np

    from kit.cli import json_text
    from kit.comm import predict_collective
    from kit.ops import Gemm

    # numpy integers count as ranks and senders, numpy bools as flags, as before
    a = predict_collective("allreduce", 1e9, "dgx-h100", np.int64(4), senders=np.int32(1))
    b = predict_collective("allreduce", 1e9, "dgx-h100", 4)
    assert a.time_ms == b.time_ms
    assert Gemm(2, 3, 4, shared_rhs=np.bool_(True)).shared_rhs
    assert json_text({"x": np.float32(0.5), "y": np.arange(2), "z": np.int64(3)}) == \
        '{\n  "x": 0.5,\n  "y": [\n    0,\n    1\n  ],\n  "z": 3\n}'
