"""latency_median_ms, the collector's second time column, is checked as latency_ms and kernel_ms
are: a given one that is not a positive finite number of ms is one KitError naming the line; a
missing one (NeuSight's rows, kit CSVs from before the column) is none."""
import pytest

from kit.data.records import load_measurements
from kit.errors import KitError

HEAD = "op,latency_ms,device_name,rows,cols,latency_median_ms"


@pytest.mark.parametrize("median", ["-1", "0", "inf", "-inf", "1e-300"])
def test_a_bad_median_time_is_refused_naming_its_line(tmp_path, median):
    path = tmp_path / "m.csv"
    path.write_text(f"{HEAD}\nadd,0.5,cpu: x,4,8,0.6\nadd,0.5,cpu: x,8,8,{median}\n")
    with pytest.raises(KitError, match=r"m\.csv: latency_median_ms must be a positive number; row 3 has"):
        load_measurements(path)


def test_a_missing_median_time_is_no_error(tmp_path):
    path = tmp_path / "m.csv"
    path.write_text(f"{HEAD}\nadd,0.5,cpu: x,4,8,0.6\nadd,0.5,cpu: x,8,8,\n")
    frame = load_measurements(path)
    assert frame.latency_median_ms.iloc[0] == 0.6 and frame.latency_median_ms.isna().iloc[1]
