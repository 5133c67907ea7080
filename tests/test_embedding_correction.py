"""The learned correction recovers a planted one, and lookup_cost applies it."""
import json
import math

import numpy as np
import pandas as pd
import pytest

from kit.embedding import Table, lookup_cost
from kit.embedding.collect import COLUMNS
from kit.embedding.correction import FEATURES, Correction, features, fit_correction
from kit.errors import KitError

GPU = "v100-sxm2-32gb"
PLANT = np.array([0.4, -0.05, 0.08, -0.3, 0.2, 0.1])


def synthetic():
    rows = []
    for b in (64, 512, 4096):
        for e in (10**4, 10**6):
            for d in (16, 128):
                for dist in ("uniform", "zipf(1.1)"):
                    for ps in ("forward", "backward"):
                        for t in (1, 4):
                            tabs = [Table(rows=e, dim=d, pooling=8)] * t
                            r = lookup_cost(tabs, b, GPU, dist, backward=ps == "backward", fused=True)
                            ms = r.time_ms * math.exp(PLANT @ features(r.parts, tabs, ps == "backward"))
                            rows.append({"backend": "fbgemm", "device": "cuda", "device_name": GPU,
                                         "pass": ps, "optimizer": "sgd" if ps == "backward" else "",
                                         "mode": "sum", "dtype": "fp32", "batch": b, "rows": e, "dim": d,
                                         "pooling": 8, "tables": t, "distribution": dist,
                                         "unique_rows": 0, "lookups": b * 8 * t, "latency_ms": ms,
                                         "latency_min_ms": ms, "repeats": 1, "torch_version": "x"})
    return pd.DataFrame(rows, columns=COLUMNS)


def test_fit_recovers_a_planted_correction(tmp_path):
    df = synthetic()
    c = fit_correction(df, ridge=1e-9)
    assert np.allclose(c.weights, PLANT, atol=1e-6)
    assert c.trained_on["mean_abs_rel_err_after"] < 1e-6 < c.trained_on["mean_abs_rel_err_before"]
    path = tmp_path / "c.json"
    c.save(path)
    c2 = Correction.load(path)
    t = Table(rows=10**5, dim=64, pooling=8)
    plain = lookup_cost(t, 256, GPU)
    fixed = lookup_cost(t, 256, GPU, correction=c2)
    expect = math.exp(PLANT @ features(plain.parts, [t], False))
    assert fixed.time_ms == pytest.approx(plain.time_ms * expect, rel=1e-6)
    assert fixed.parts["analytic_ms"] == pytest.approx(plain.time_ms)


def test_errors(tmp_path):
    with pytest.raises(KitError, match="at least"):
        fit_correction(synthetic().head(3))
    cpu = synthetic().assign(device_name="cpu")
    with pytest.raises(KitError, match="CPU"):
        fit_correction(cpu)
    bad = tmp_path / "bad.json"
    bad.write_text('{"features": ["x"], "weights": [1]}')
    with pytest.raises(KitError, match="not an embedding correction"):
        Correction.load(bad)
    assert len(FEATURES) == len(PLANT)


@pytest.mark.parametrize("text", ['[1, 2]', '"weights"', '{"features": %s, "weights": null}',
                                  '{"features": %s, "weights": ["a", 1, 1, 1, 1, 1]}',
                                  '{"features": %s, "weights": [NaN, 0, 0, 0, 0, 0]}',
                                  '{"features": %s, "weights": [Infinity, 0, 0, 0, 0, 0]}'])
def test_a_malformed_correction_file_is_one_kit_error(tmp_path, text):
    # each had ended in a traceback (AttributeError, TypeError, ValueError), or, NaN weights, been
    # kept: factor() then scaled every prediction by the clamp's 10x
    bad = tmp_path / "c.json"
    bad.write_text(text.replace("%s", json.dumps(list(FEATURES))))
    with pytest.raises(KitError, match=str(bad)):
        Correction.load(bad)


def test_an_unreadable_correction_file_is_one_kit_error(tmp_path):
    with pytest.raises(KitError, match="cannot read"):
        Correction.load(tmp_path)  # a directory
    binary = tmp_path / "c.json"
    binary.write_bytes(b"\xff\xfe\x00")
    with pytest.raises(KitError, match="UTF-8"):
        Correction.load(binary)


def test_a_backward_row_with_no_optimizer_is_fit_as_sgd(tmp_path):
    # the reader takes an empty optimizer (the backends time it as sgd) and load() reads the empty
    # cell as NaN, which the fitter had kept: "unknown optimizer 'nan'"
    df = synthetic().assign(unique_rows=1)
    path, blank = tmp_path / "sgd.csv", tmp_path / "blank.csv"
    df.to_csv(path, index=False)
    df.assign(optimizer="").to_csv(blank, index=False)
    assert fit_correction(blank).weights == pytest.approx(fit_correction(path).weights, rel=1e-12)


@pytest.mark.parametrize("text", ['{"features": 5, "weights": [0, 0, 0, 0, 0, 0]}',
                                  '{"features": %s, "weights": [1%s, 0, 0, 0, 0, 0]}' % ("%s", "0" * 400),
                                  "[" * 100_000 + "]" * 100_000])
def test_a_correction_file_of_odd_json_is_one_kit_error(tmp_path, text):
    # features 5 had been a TypeError, a weight of 401 digits an OverflowError (JSON's whole
    # numbers are unbounded; isfinite converts them to float), arrays nested 100,000 deep a
    # RecursionError
    bad = tmp_path / "c.json"
    bad.write_text(text.replace("%s", json.dumps(list(FEATURES))))
    with pytest.raises(KitError, match=str(bad)):
        Correction.load(bad)


def test_a_correction_is_refused_on_a_gpu_it_was_not_fit_on(tmp_path):
    """The weights hold one GPU's gather efficiency and kernel choice: an H100's lookups scaled by
    a V100's correction had been a silent wrong number."""
    c = fit_correction(synthetic(), ridge=1e-9)
    assert c.gpu == GPU
    t = Table(rows=10**5, dim=64, pooling=8)
    with pytest.raises(KitError, match=f"fit on {GPU}, not h100-sxm"):
        lookup_cost(t, 256, "h100-sxm", correction=c)
    lookup_cost(t, 256, GPU, correction=c)  # its own GPU, by key
    anywhere = Correction(c.weights, gpu=None)  # one that says nothing of its GPU is not checked
    assert lookup_cost(t, 256, "h100-sxm", correction=anywhere).parts["correction"] != 1.0


def test_a_correction_files_gpu_must_be_text(tmp_path):
    bad = tmp_path / "c.json"
    bad.write_text(json.dumps({"features": list(FEATURES), "weights": [0.0] * len(FEATURES), "gpu": 5}))
    with pytest.raises(KitError, match="gpu must be"):
        Correction.load(bad)


@pytest.mark.parametrize("recorded", ["h100", "H100-SXM", "a100-sxm4-40gb, h100"])
def test_a_correction_naming_its_gpu_by_an_alias_applies_on_that_gpu(recorded):
    """A correction made by hand may name its GPU as get_gpu reads it ("h100"): it had been
    refused on h100-sxm, the GPU it names ("fit on h100, not h100-sxm"), and a space after a
    comma had made the second GPU unknown. Another GPU is still refused."""
    c = Correction((0.1,) + (0.0,) * (len(FEATURES) - 1), gpu=recorded)
    t = Table(rows=10**5, dim=64, pooling=8)
    assert lookup_cost(t, 256, "h100-sxm", correction=c).parts["correction"] != 1.0
    with pytest.raises(KitError, match="not v100-pcie-32gb"):
        lookup_cost(t, 256, "v100", correction=c)
