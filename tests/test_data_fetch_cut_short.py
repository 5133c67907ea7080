"""A download cut short mid-body (http.client.IncompleteRead, as a dropped chunked transfer ends)
or stopped by Ctrl-C is one KitError (or the interrupt), with no FILE.part left behind."""
import hashlib
import http.client

import pytest

from kit.data import fetch
from kit.errors import KitError

BODY = b"MIT\n"
MANIFEST = {"commit": fetch.NEUSIGHT_COMMIT, "folder": "scripts/asplos",
            "files": {"LICENSE": {"sha256": hashlib.sha256(BODY).hexdigest(), "bytes": len(BODY)}}}


class CutResponse:
    """Gives the first bytes, then fails the way its `error` says."""

    def __init__(self, error):
        self.error, self.calls = error, 0

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def read(self, amt=None):
        self.calls += 1
        if self.calls == 1:
            return BODY[:2]
        raise self.error


def test_a_connection_cut_mid_body_is_one_error_and_leaves_no_part_file(tmp_path):
    dest = tmp_path / "dest"
    dest.mkdir()
    with pytest.raises(KitError, match="could not download .*LICENSE: IncompleteRead"):
        fetch.fetch_neusight(dest=dest, manifest=MANIFEST, progress=False,
                             opener=lambda url: CutResponse(http.client.IncompleteRead(b"", 2)))
    assert list(dest.iterdir()) == []


def test_an_interrupted_download_leaves_no_part_file(tmp_path):
    dest = tmp_path / "dest"
    dest.mkdir()
    with pytest.raises(KeyboardInterrupt):
        fetch.fetch_neusight(dest=dest, manifest=MANIFEST, progress=False,
                             opener=lambda url: CutResponse(KeyboardInterrupt()))
    assert list(dest.iterdir()) == []
