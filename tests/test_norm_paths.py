"""kit.predict.norm_paths: PyTorch's two-kernel layer norm for widths it cannot vectorise, read off
the H200's layer-norm sweeps (benchmarks/layernorm_paths.py)."""
from __future__ import annotations

import pytest

from benchmark_modules import load_benchmark
from kit.hardware import get_gpu
from kit.ops import LayerNorm, RMSNorm
from kit.predict import get_predictor, norm_paths
from kit.workload.kernel_times import isolation_floor_ms


@pytest.fixture(scope="module")
def bench():
    return load_benchmark("layernorm_paths")


@pytest.fixture(scope="module")
def rows(bench):
    return bench.layernorm_rows(bench.DEFAULT_DIRS)


def test_the_width_alone_decides_the_path(rows):
    assert len(rows) > 300 and rows.unaligned.any() and (~rows.unaligned).any()
    assert (rows.two_kernels == rows.unaligned).all()


def test_the_shipped_constants_are_the_fit(bench, rows):
    c = bench.fit(rows[rows.two_kernels])
    assert c["fixed_clocks"] == pytest.approx(norm_paths.TWO_KERNEL_FIXED_CLOCKS, rel=2e-3)
    assert c["row_clocks"] == pytest.approx(norm_paths.TWO_KERNEL_ROW_CLOCKS, rel=2e-3)
    assert c["elem_clocks"] == pytest.approx(norm_paths.TWO_KERNEL_ELEM_CLOCKS, rel=5e-3)


def test_one_dtype_predicts_the_other(bench, rows):
    # instruction-bound, not bytes: fitted on bf16 rows, fp32 rows score within the fit's own error
    two = rows[rows.two_kernels]
    for train, test in (("bf16", "fp32"), ("fp32", "bf16")):
        s = bench.scores(two[two.dtype == test], bench.fit(two[two.dtype == train]))
        assert s["n"] > 100 and s["mape"] < 15, (train, s)


def test_the_predictor_prices_the_two_kernels(bench, rows):
    scores = bench.tile_scores(rows)
    assert scores["two_kernels"]["mape"] < 15  # 56% before the rule: the tile-MLP had them 2-4x fast


def test_only_unvectorisable_layer_norms_on_nvidia_are_bound():
    tile = get_predictor("tile")
    h200 = get_gpu("h200")
    ops = [LayerNorm(8192, 1023, "bf16"), LayerNorm(8192, 1024, "bf16"), RMSNorm(8192, 1023, "bf16")]
    p = tile.predict(ops, h200).latency_ms.to_numpy(float)
    low = norm_paths.two_kernel_ms([8192], [1023], h200)[0] + isolation_floor_ms(tile, h200)
    assert p[0] >= low * (1 - 1e-9) and p[0] > 1.5 * p[1]
    assert p[2] < low  # an RMSNorm is not PyTorch's layer norm kernel
    assert not norm_paths.two_kernel_mask([LayerNorm(8192, 1023)], get_gpu("mi300x")).any()
    band = tile.predict([LayerNorm(8192, 1023, "bf16")], h200).iloc[0]
    assert band.latency_p10_ms <= band.latency_ms <= band.latency_p90_ms
    assert 0 < band.utilisation <= 1


def test_the_benchmark_names_a_missing_folder(bench, tmp_path, capsys):
    assert bench.main(["--dir", str(tmp_path / "nope")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "not found" in err and "nope" in err
    assert bench.main(["--dir", str(tmp_path)]) == 2  # a folder with no sweeps
    assert "no vector sweeps" in capsys.readouterr().err


def test_a_tensor_parallel_share_of_an_aligned_row_stays_vectorisable():
    from kit.parallel.opgraph import _shard

    share = _shard(LayerNorm(3, 1600), 32)  # 1600 / 32 = 50 columns: rounded up to 52
    assert share.cols % norm_paths.VECTOR_ELEMS == 0 and share.cols >= 1600 // 32
    assert not norm_paths.two_kernel_mask([share], get_gpu("h200")).any()
    assert _shard(LayerNorm(3, 1601), 32).cols == 51  # an unaligned row's share keeps its width
