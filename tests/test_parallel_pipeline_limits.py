"""What no pipeline engine runs is refused, not priced: ZeRO-2/3 (sharded gradients) with
pp > 1 (DeepSpeed's PipelineEngine asserts; Megatron-LM's distributed optimizer is ZeRO-1)."""
import pytest

from kit.errors import KitError
from kit.parallel import Layout
from test_audit_single import _cache, _kit  # noqa: F401  (_cache: autouse, a fresh KIT_CACHE)


@pytest.mark.parametrize("zero", [2, 3])
def test_zero_2_and_3_are_refused_with_pipeline_parallelism(zero):
    with pytest.raises(KitError, match=f"--zero {zero} with --pp 4.*incompatible with pipeline parallelism"):
        Layout(dp=2, pp=4, zero=zero)
    Layout(dp=2, pp=4, zero=1)  # Megatron's distributed optimizer: ZeRO-1 runs with a pipeline
    Layout(dp=2, pp=1, zero=zero)  # and ZeRO-2/3 without one


def test_the_cli_says_it_in_one_line(capsys):
    rc, out, err = _kit(capsys, "predict", "gpt:layers=4,hidden=512,heads=8,seq=256", "--system",
                        "dgx-a100", "--dp", "2", "--pp", "4", "--zero", "3")
    assert rc != 0 and "incompatible with pipeline parallelism" in err and "Traceback" not in err
