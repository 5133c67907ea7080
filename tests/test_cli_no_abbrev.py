"""No `kit` option may be abbreviated: argparse's default prefix matching had read
`kit replay TRACE --gpu h100-sxm` (replay has no --gpu) as --gpu-file h100-sxm, and the user got
an error about a --gpu-file they never gave."""
import pytest

from kit.cli import main


@pytest.mark.parametrize("argv, stray", [
    (["gpus", "--js"], "--js"),  # --json
    (["comm", "predict", "allreduce", "--byte", "1e9", "--system", "dgx-h100"], "--byte"),  # --bytes
    (["replay", "no-such-trace.json", "--gpu", "h100-sxm"], "--gpu"),  # --gpu-file
])
def test_an_abbreviated_option_is_refused_by_its_name(capsys, argv, stray):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "unrecognized arguments" in err and stray in err
    assert "Traceback" not in err and "--gpu-file" not in err


def test_the_full_option_still_works(capsys):
    assert main(["gpus", "--json"]) == 0
    assert capsys.readouterr().out.lstrip().startswith(("[", "{"))
