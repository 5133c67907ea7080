"""`kit op` refuses a dtype the GPU lacks for every op kind, as it did for GEMMs and as a whole
model does (bf16 softmax on a V100, bf16 elementwise on a T4 and fp8 on an A100 were priced)."""
import pytest

from kit.cli import main


@pytest.mark.parametrize("argv, words", [
    (["softmax", "--rows", "100", "--cols", "1000", "--dtype", "bf16", "--gpu", "v100-sxm2-32gb"],
     "v100-sxm2-32gb has no bf16 support"),
    (["elementwise", "--numel", "1000000", "--dtype", "bf16", "--gpu", "t4"], "t4 has no bf16 support"),
    (["elementwise", "--numel", "1000000", "--dtype", "fp8", "--gpu", "a100"], "has no fp8 support"),
    (["gemm", "--m", "100", "--n", "1000", "--k", "100", "--dtype", "bf16", "--gpu", "v100-sxm2-32gb"],
     "has no bf16 support"),
])
def test_a_dtype_the_gpu_lacks_is_one_line(capsys, argv, words):
    assert main(["op", *argv]) == 2
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert len(err) == 1 and words in err[0]


def test_a_dtype_the_gpu_has_is_priced(capsys):
    assert main(["op", "elementwise", "--numel", "1000000", "--dtype", "bf16", "--gpu", "a100", "--json"]) == 0
    assert '"latency_ms"' in capsys.readouterr().out
