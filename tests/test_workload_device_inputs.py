"""A device given as a workload input file (--overhead-trace /dev/zero, a config .json linked to
/dev/zero) is one KitError naming it, refused before any read: zipfile.is_zipfile and
Path.read_text read /dev/zero until a MemoryError traceback. The readers are made to fail loudly
here so that a read before the refusal fails the test without exhausting memory."""
import os
import zipfile
from pathlib import Path

import pytest

from kit.cli import main
from kit.errors import KitError
from kit.workload import models, overhead

ZERO = "/dev/zero"
pytestmark = pytest.mark.skipif(not os.path.exists(ZERO), reason="no /dev/zero")


@pytest.fixture(autouse=True)
def _no_read(monkeypatch, tmp_path):
    monkeypatch.setenv("KIT_CACHE", str(tmp_path / "cache"))

    def boom(*a, **k):
        raise AssertionError("read a device before refusing it")

    monkeypatch.setattr(zipfile, "is_zipfile", boom)
    monkeypatch.setattr(Path, "read_text", boom)
    monkeypatch.setattr(Path, "read_bytes", boom)


def test_overhead_trace_device_is_refused_before_reading():
    with pytest.raises(KitError, match="device"):
        overhead.calibrate(ZERO)


def test_config_json_linked_to_a_device_is_refused_before_reading(tmp_path):
    link = tmp_path / "zero.json"
    link.symlink_to(ZERO)
    with pytest.raises(KitError, match="zero.json.*device"):
        models.read_config(str(link))


def test_cli_names_the_device_in_one_line(tmp_path, capsys):
    link = tmp_path / "zero.json"
    link.symlink_to(ZERO)
    for argv in (["predict", "gpt2", "--gpu", "h100-sxm", "--overhead-trace", ZERO],
                 ["predict", str(link), "--gpu", "h100-sxm"]):
        assert main(argv) == 2
        err = capsys.readouterr().err.strip()
        assert "device" in err and "Traceback" not in err and len(err.splitlines()) == 1, err
