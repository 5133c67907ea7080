"""Whole-number flags are read exactly (kit.whole_numbers), not through float: 2**53 + 1 had
become 2**53, and 1 + 1e-16 had passed as the whole number 1 (a 1-byte memcpy, a 1-byte
collective)."""
import argparse

import pytest

from kit.cli import main, non_negative_int, positive_int
from kit.comm.sizes import parse_sizes
from kit.errors import KitError
from kit.whole_numbers import exact_whole


def test_positive_int_keeps_every_digit():
    assert positive_int("9007199254740993") == 2**53 + 1  # the first integer a double cannot hold
    assert positive_int("1e9") == 10**9 and positive_int("4096") == 4096
    for bad in ("1.0000000000000001", "1.5", "0", "1e400", "nan", "3/2"):
        with pytest.raises(argparse.ArgumentTypeError):
            positive_int(bad)
    assert non_negative_int("0") == 0
    with pytest.raises(argparse.ArgumentTypeError):  # far below 1 is not 0
        non_negative_int("1e-5000")


def test_exact_whole_scales_exactly():
    assert exact_whole("1.5", 1024) == 1536 and exact_whole("0.5", 2**30) == 2**29
    with pytest.raises(ValueError):
        exact_whole("1.0000000000000001")
    with pytest.raises(ValueError):
        exact_whole("1.00000000000000000000000000000000001", 1024)  # past a double and Decimal's 28 digits


def test_byte_sizes_are_whole_exactly(capsys):
    assert parse_sizes("1.5K") == [1536] and parse_sizes("1e9") == [10**9]
    with pytest.raises(KitError, match="sizes are whole bytes"):
        parse_sizes("1.0000000000000001")
    assert main(["comm", "predict", "allreduce", "--bytes", "1.0000000000000001",
                 "--system", "dgx-h100"]) == 2
    err = capsys.readouterr().err
    assert "--bytes takes one positive whole size" in err and len(err.strip().splitlines()) == 1
    assert main(["op", "memcpy", "--bytes", "1.0000000000000001", "--gpu", "h100"]) == 2
    err = capsys.readouterr().err
    assert "expected a positive whole number" in err and len(err.strip().splitlines()) == 1
