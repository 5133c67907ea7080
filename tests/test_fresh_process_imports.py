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


def _regexes_compiled(code: str) -> list:
    """The patterns re's module functions are handed while `code` runs in a fresh process (after
    kit.comm's import): each a compile on its first use."""
    src = ("import json, re\nfrom kit.comm import predict_collective\nseen = []\nreal = re._compile\n"
           "re._compile = lambda p, f: (seen.append(str(p)), real(p, f))[1]\n" + code
           + "\nprint(json.dumps(seen))")
    out = subprocess.run([sys.executable, "-c", src], capture_output=True, text=True, check=True)
    import json

    return json.loads(out.stdout.strip().splitlines()[-1])


def test_a_first_collective_compiles_no_regex():
    # a system name was normalised and its -x<nodes> read with two regexes, compiled on the first
    # call (0.15 ms of a fresh process's 0.9 ms first collective)
    assert _regexes_compiled("predict_collective('allreduce', 1e9, 'dgx-h100')") == []
    assert _regexes_compiled("predict_collective('allreduce', 1e9, 'DGX H100 x2', nccl_tests=True)") == []


def test_system_names_read_as_the_regexes_read_them():
    import random
    import re

    from kit.hardware.system import _nodes_suffix, _norm

    rnd = random.Random(0)
    chars = "abcXYZ019-_ .xX/\u00e9\u0130\u2460\u0663"  # with non-ASCII letters and digits
    for _ in range(20000):
        s = "".join(rnd.choice(chars) for _ in range(rnd.randint(0, 12)))
        s += f"-x{rnd.randint(0, 999)}" if rnd.random() < 0.3 else ""
        want = re.sub(r"[^a-z0-9]+", "-", s.lower()).strip("-")
        assert _norm(s) == want
        m = re.fullmatch(r"(.+)-x(\d+)", want)
        assert _nodes_suffix(want) == (m and (m.group(1), int(m.group(2))))
