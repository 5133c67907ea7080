"""A NeuSight conv row's dimensions are checked as a kit CSV's are (schema.check_rows): positive,
but the padding, which may be 0. One that is 0 is a KitError naming file:line and the column."""
import pytest

from kit.data import load_measurements
from kit.errors import KitError

HEAD = "OPName,Latency,Device,B,Input_Channel,Output_Channel,Kernel_Szie,Input_Size,Stride,Padding"
GOOD = [1, 3, 8, 3, 8, 1, 1]
COLUMNS = HEAD.split(",")[3:]


def _csv(tmp_path, dims):
    path = tmp_path / "conv.csv"
    row = ",".join(map(str, dims))
    path.write_text(f"{HEAD}\nconv,0.5,NVIDIA A100-PCIE-40GB,{','.join(map(str, GOOD))}\n"
                    f"conv,0.5,NVIDIA A100-PCIE-40GB,{row}\n")
    return path


@pytest.mark.parametrize("i", range(6))  # every dimension but the padding
def test_a_zero_conv_dimension_is_refused_naming_its_line_and_column(tmp_path, i):
    dims = list(GOOD)
    dims[i] = 0
    with pytest.raises(KitError, match=rf"conv\.csv:3: column '{COLUMNS[i]}' must hold a positive"):
        load_measurements(_csv(tmp_path, dims))


def test_a_padding_of_zero_is_a_conv_row(tmp_path):
    frame = load_measurements(_csv(tmp_path, [*GOOD[:6], 0]))
    assert frame.padding.tolist() == [1, 0] and frame.stride.tolist() == [1, 1]
