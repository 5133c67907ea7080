"""Errors about a row of a measurement CSV name the file's own line: pandas skips blank lines,
and "row index + 2" had named line 4 for the bad latency on line 6 of a file with two blank
lines. The invariant checked: the line an error names holds the bad value."""
import gzip
import re

import pytest

from kit.data import load_measurements
from kit.errors import KitError

NS_HEAD = "OPName,Latency,Device,B,M,N,K"
NS_OK = "bmm,0.40,NVIDIA L4,4,512,512,512"
KIT_HEAD = "op,latency_ms,gpu,device_name,b,m,n,k"
KIT_OK = "bmm,0.40,l4,NVIDIA L4,4,512,512,512"
# blank lines as files have them: empty, spaces and tabs alone, CRLF, before the header too
LEADS = [["", "  "], ["\t", ""]]


def _named_line(message: str, path) -> int:
    m = re.search(re.escape(str(path)) + r":(\d+)", message) or re.search(r"row (\d+)", message)
    assert m, message
    return int(m.group(1))


def _check(path, lines, bad_token, gz=False):
    text = "\n".join(lines) + "\n"
    if gz:
        path.write_bytes(gzip.compress(text.encode()))
    else:
        path.write_text(text)
    with pytest.raises(KitError) as e:
        load_measurements(path)
    n = _named_line(str(e.value), path)
    assert bad_token in lines[n - 1], (str(e.value), lines)


BAD_NEUSIGHT = [  # (bad row, a token only it holds)
    ("bmm,fast,NVIDIA L4,4,512,512,512", "fast"),  # Latency
    ("nosuchop,0.4,NVIDIA L4,4,512,512,512", "nosuchop"),  # an unknown OPName
    ("bmm,0.40,NVIDIA L4,4,-512,512,512", "-512"),  # a dimension
    (",0.77,NVIDIA L4,4,512,512,512", "0.77"),  # OPName empty
]
BAD_KIT = [
    ("bmm,fast,l4,NVIDIA L4,4,512,512,512", "fast"),  # latency_ms not a number (conform)
    ("bmm,inf,l4,NVIDIA L4,4,512,512,512", "inf"),  # latency_ms not finite (check_times)
    ("nosuchop,0.4,l4,NVIDIA L4,4,512,512,512", "nosuchop"),  # an unknown op
    ("bmm,0.77,l4,NVIDIA L4,4,0,512,512", "0.77"),  # a zero dimension (check_rows)
]


@pytest.mark.parametrize("gz", [False, True])
@pytest.mark.parametrize("bad,token", BAD_NEUSIGHT)
def test_a_neusight_csv_error_names_the_line_of_the_bad_row(tmp_path, bad, token, gz):
    lines = [NS_HEAD, NS_OK, "", NS_OK, "  ", bad, NS_OK]  # the bad row on line 6 (had said 4)
    _check(tmp_path / ("t.csv.gz" if gz else "t.csv"), lines, token, gz)
    _check(tmp_path / "lead.csv", [*LEADS[0], NS_HEAD, "\t", NS_OK, bad], token)


@pytest.mark.parametrize("bad,token", BAD_KIT)
def test_a_kit_csv_error_names_the_line_of_the_bad_row(tmp_path, bad, token):
    _check(tmp_path / "k.csv", [KIT_HEAD, KIT_OK, "", "", KIT_OK, bad, KIT_OK], token)
    _check(tmp_path / "lead.csv", [*LEADS[1], KIT_HEAD, KIT_OK, " ", bad], token)


def test_crlf_and_a_quoted_field_over_two_lines_count_as_the_file_has_them(tmp_path):
    p = tmp_path / "crlf.csv"
    p.write_bytes(("OPName,Latency,Device,B,M,N,K,Kernels\r\n"
                   'bmm,0.40,NVIDIA L4,4,512,512,512,"a;\r\nb"\r\n\r\n'
                   "bmm,slow,NVIDIA L4,4,512,512,512,c\r\n").encode())
    with pytest.raises(KitError, match=re.escape(f"{p}:5: Latency")):
        load_measurements(p)


def test_without_blank_lines_the_line_is_the_row_plus_two(tmp_path):
    # the common case is unchanged: the second data row is line 3
    _check(tmp_path / "plain.csv", [NS_HEAD, NS_OK, "bmm,fast,NVIDIA L4,4,512,512,512"], "fast")


def test_blank_lines_before_the_header_are_skipped_as_pandas_skips_them(tmp_path):
    # the header was taken from the first line: a leading blank line made the file "empty"
    p = tmp_path / "lead.csv"
    p.write_text("\n \n" + NS_HEAD + "\n" + NS_OK + "\n")
    assert len(load_measurements(p)) == 1
    k = tmp_path / "cut.csv"  # a killed writer's unfinished last line is still dropped
    k.write_text("\n" + KIT_HEAD + "\n" + KIT_OK + "\nbmm,0.5,l4")
    with pytest.warns(UserWarning, match="ignored an unfinished last line"):
        assert len(load_measurements(k)) == 1
