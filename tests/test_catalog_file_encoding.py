"""A GPU file is JSON in whichever Unicode encoding the editor or shell wrote it: UTF-8 with a BOM
(Notepad) or UTF-16 (Windows PowerShell 5's `kit gpus --json > my.json`) had been refused as
"not valid JSON: Unexpected UTF-8 BOM" and "not a text (JSON) file"."""
import json

import pytest

from kit.errors import KitError
from kit.hardware import get_gpu, load_gpu_file, unregister_gpu


def _entry():
    e = get_gpu("a100-pcie-40gb").to_dict()
    e.update(key="enc-gpu", name="Encoded GPU (ü)", aliases=[])
    return e


@pytest.mark.parametrize("encoding", ["utf-8", "utf-8-sig", "utf-16", "utf-16-le", "utf-32"])
def test_a_gpu_file_in_any_unicode_encoding_loads(tmp_path, encoding):
    path = tmp_path / "gpus.json"
    path.write_bytes(json.dumps([_entry()], ensure_ascii=False).encode(encoding))
    try:
        (gpu,) = load_gpu_file(path)
        assert gpu.name == "Encoded GPU (ü)" and get_gpu("enc-gpu") is gpu
    finally:
        unregister_gpu("enc-gpu")


def test_bytes_that_are_no_text_are_still_one_kit_error(tmp_path):
    path = tmp_path / "gpus.json"
    path.write_bytes(b'[{"key": "\xff\xfe\xfa"}]')
    with pytest.raises(KitError, match="not a text"):
        load_gpu_file(path)
