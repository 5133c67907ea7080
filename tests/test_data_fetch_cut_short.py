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


def _two_file_mirror(tmp_path):
    """A mirror that serves the first of two manifest files and lacks the second."""
    bodies = {"data/dataset/train/collect/bmm/p2.1.0/Tesla P4.csv":
              b"OPName,Latency,Device,B,M,N,K\nbmm,0.05,Tesla P4,6,27,21,390\n",
              "data/dataset/train/collect/bmm/p2.1.0/Tesla T4.csv":
              b"OPName,Latency,Device,B,M,N,K\nbmm,0.03,Tesla T4,6,27,21,390\n"}
    manifest = {"commit": fetch.NEUSIGHT_COMMIT, "folder": "scripts/asplos",
                "files": {rel: {"sha256": hashlib.sha256(b).hexdigest(), "bytes": len(b)}
                          for rel, b in bodies.items()}}
    mirror = tmp_path / "mirror"
    first = mirror / "scripts/asplos" / next(iter(bodies))
    first.parent.mkdir(parents=True)
    first.write_bytes(next(iter(bodies.values())))
    return mirror, manifest, bodies


def test_a_folder_a_fetch_did_not_finish_is_refused_until_it_does(tmp_path, monkeypatch):
    from kit.data import load_neusight

    monkeypatch.setenv("KIT_CACHE", str(tmp_path / "cache"))
    mirror, manifest, bodies = _two_file_mirror(tmp_path)
    dest = tmp_path / "dest"
    with pytest.raises(KitError, match="could not download"):
        fetch.fetch_neusight(dest=dest, base_url=mirror.as_uri(), manifest=manifest, progress=False)
    # the P4's file came, the T4's did not: the folder is not the data set, and says so
    with pytest.raises(KitError, match="did not finish .*kit data fetch neusight --dest"):
        load_neusight("train-collect", data_dir=dest)
    last = mirror / "scripts/asplos" / list(bodies)[1]
    last.write_bytes(bodies[list(bodies)[1]])
    r = fetch.fetch_neusight(dest=dest, base_url=mirror.as_uri(), manifest=manifest, progress=False)
    assert (r["downloaded"], r["verified"]) == (1, 1)
    assert sorted(load_neusight("train-collect", data_dir=dest).gpu) == ["p4", "t4"]
    assert not (dest / fetch.INCOMPLETE_MARK).exists()


def test_a_fetch_that_changed_nothing_leaves_the_folder_as_loadable_as_it_was(tmp_path, monkeypatch):
    """A copy of NeuSight's scripts/asplos holds all the data but not LICENSE (it is at the
    repository root). Fetched into offline, its first download (LICENSE) fails before any file
    changes: the folder must load as before, not be refused as a fetch left unfinished."""
    from kit.data import load_neusight

    monkeypatch.setenv("KIT_CACHE", str(tmp_path / "cache"))
    mirror, manifest, bodies = _two_file_mirror(tmp_path)
    manifest["files"].update(MANIFEST["files"])  # LICENSE, which sorts first, is not on the mirror
    dest = tmp_path / "asplos"
    for rel, body in bodies.items():
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        (dest / rel).write_bytes(body)
    before = load_neusight("train-collect", data_dir=dest, cache=False)
    with pytest.raises(KitError, match="could not download .*LICENSE"):
        fetch.fetch_neusight(dest=dest, base_url=mirror.as_uri(), manifest=manifest, progress=False)
    after = load_neusight("train-collect", data_dir=dest, cache=False)
    assert sorted(after.gpu) == sorted(before.gpu) == ["p4", "t4"]
    # a folder an earlier fetch left unfinished stays refused when a rerun fails before any file
    (dest / fetch.INCOMPLETE_MARK).write_text("unfinished\n")
    with pytest.raises(KitError, match="could not download .*LICENSE"):
        fetch.fetch_neusight(dest=dest, base_url=mirror.as_uri(), manifest=manifest, progress=False)
    with pytest.raises(KitError, match="did not finish"):
        load_neusight("train-collect", data_dir=dest, cache=False)
