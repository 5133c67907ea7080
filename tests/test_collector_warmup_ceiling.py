"""`--warmup-ms` has the ceiling `--cooldown-ms` has (an hour, 3,600,000 ms), in `kit collect`
and `kit collect-embedding` alike, and both refuse NaN, infinite and negative values before
measuring anything."""
import pytest

from cli_support import one_error_line as _err
from kit.data import collect as C
from kit.embedding import collect as E
from kit.errors import KitError

BAD = ["1e12", "3600001", "1e300", "inf", "nan", "-5"]


class Warmed(BaseException):
    """A warm-up began: without the ceiling, 1e12 ms would run for 31 years (and the collector
    outlives SIGTERM), so the test stops it here and fails at once instead of hanging."""


@pytest.fixture(autouse=True)
def no_warmup(monkeypatch):
    def warm_for(*a, **kw):
        raise Warmed
    monkeypatch.setattr(C, "warm_for", warm_for)
    monkeypatch.setattr(E, "warm_for", warm_for)


@pytest.mark.parametrize("value", BAD)
def test_collect_refuses_a_warmup_past_an_hour_or_not_a_number(tmp_path, capsys, value):
    # 1e12 ms (31 years) had passed the finite check and would have warmed the first op for that long
    out = tmp_path / "c.csv"
    line = _err(capsys, ["collect", "--ops", "gemm", "--shapes", "tiny-gemm:1", "--device", "cpu",
                         "--out", str(out), "--warmup-ms", value])
    assert "--warmup-ms" in line and "3,600,000" in line and "(an hour)" in line, line
    assert not out.exists()


@pytest.mark.parametrize("value", BAD)
def test_collect_embedding_refuses_the_same_warmups(tmp_path, capsys, value):
    out = tmp_path / "e.csv"
    line = _err(capsys, ["collect-embedding", "--out", str(out), "--batch", "8", "--rows", "64",
                         "--dim", "4", "--pooling", "2", "--dist", "uniform", "--warmup-ms", value])
    assert "--warmup-ms" in line and "3,600,000" in line and "(an hour)" in line, line
    assert not out.exists()


@pytest.mark.parametrize("value", [True, "5", 3_600_001])
def test_the_python_api_takes_the_same_rule(tmp_path, value):
    with pytest.raises(KitError, match="--warmup-ms must be a number of milliseconds from 0 to 3,600,000"):
        C.collect("bmm", [(1, 4, 4, 4)], tmp_path / "c.csv", device="cpu", warmup_ms=value, progress=False)
    with pytest.raises(KitError, match="--warmup-ms must be a number of milliseconds from 0 to 3,600,000"):
        E.collect(E.grid([8], [64], [4], [2], ["uniform"]), tmp_path / "e.csv", warmup_ms=value)


def test_an_hour_itself_is_taken():
    # the bound is inclusive, as --cooldown-ms's: 3,600,000 ms passes the check, 3,600,001 does not
    C.check_wait_ms("--warmup-ms", 3_600_000, C.MAX_WARMUP_MS)
    C.check_wait_ms("--warmup-ms", 0, C.MAX_WARMUP_MS)
    assert C.MAX_WARMUP_MS == 60 * 60 * 1000
