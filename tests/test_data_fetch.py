"""`kit data fetch neusight`: pinned URLs, hash checks, resumable, no network (file:// mirrors)."""
import hashlib
import os
from pathlib import Path

import pytest

from kit.data import fetch
from kit.errors import KitError

REPO = Path(__file__).resolve().parents[1]
NEUSIGHT = Path(os.environ.get("KIT_DATA", REPO.parent / "shared" / "data" / "neusight"))


def _mirror(tmp_path):
    """A local copy of the upstream repo layout: LICENSE at the root, data under scripts/asplos/."""
    root = tmp_path / "mirror"
    files = {"LICENSE": b"MIT\n", "data/dataset/train/collect/bmm/p2.1.0/Tesla P4.csv": b"OPName,Latency\n",
             "label/NVIDIA_L4/gpt2_large-inf-1024-4.json": b'{"e2e_latency": 1}'}
    for rel, body in files.items():
        path = root / (rel if rel == "LICENSE" else f"scripts/asplos/{rel}")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(body)
    manifest = {"commit": fetch.NEUSIGHT_COMMIT, "folder": "scripts/asplos",
                "files": {rel: {"sha256": hashlib.sha256(b).hexdigest(), "bytes": len(b)}
                          for rel, b in files.items()}}
    return root, manifest, files


def test_fetch_from_a_file_url_mirror(tmp_path):
    root, manifest, files = _mirror(tmp_path)
    dest = tmp_path / "dest"
    r = fetch.fetch_neusight(dest=dest, base_url=root.as_uri(), manifest=manifest, progress=False)
    assert (r["files"], r["downloaded"], r["verified"]) == (3, 3, 0)
    for rel, body in files.items():
        assert (dest / rel).read_bytes() == body
    again = fetch.fetch_neusight(dest=dest, base_url=root.as_uri(), manifest=manifest, progress=False)
    assert (again["downloaded"], again["verified"]) == (0, 3)


def test_a_file_that_fails_its_hash_is_not_kept(tmp_path):
    root, manifest, _ = _mirror(tmp_path)
    (root / "LICENSE").write_bytes(b"tampered\n")
    dest = tmp_path / "dest"
    with pytest.raises(KitError, match="LICENSE: sha256 .* does not match"):
        fetch.fetch_neusight(dest=dest, base_url=root.as_uri(), manifest=manifest, progress=False)
    assert not (dest / "LICENSE").exists() and not (dest / "LICENSE.part").exists()


def test_a_corrupt_file_in_the_kits_cache_is_downloaded_again(tmp_path, monkeypatch):
    root, manifest, files = _mirror(tmp_path)
    dest = tmp_path / "cache"
    monkeypatch.setattr(fetch, "fetched_dir", lambda: dest)
    fetch.fetch_neusight(base_url=root.as_uri(), manifest=manifest, progress=False)
    (dest / "LICENSE").write_bytes(b"broken")
    r = fetch.fetch_neusight(base_url=root.as_uri(), manifest=manifest, progress=False)
    assert r["downloaded"] == 1 and (dest / "LICENSE").read_bytes() == files["LICENSE"]
    (dest / "LICENSE").write_bytes(b"broken")  # the cache named as --dest is still the kit's
    r = fetch.fetch_neusight(dest=str(dest), base_url=root.as_uri(), manifest=manifest, progress=False)
    assert r["downloaded"] == 1 and (dest / "LICENSE").read_bytes() == files["LICENSE"]


def test_a_differing_file_in_a_dest_of_ones_own_is_replaced_only_with_force(tmp_path):
    # it had been written over unasked: an edited CSV, or a file of one's own at that path
    root, manifest, files = _mirror(tmp_path)
    dest = tmp_path / "dest"
    fetch.fetch_neusight(dest=dest, base_url=root.as_uri(), manifest=manifest, progress=False)
    (dest / "LICENSE").write_bytes(b"MINE\n")
    with pytest.raises(KitError, match="holds 1 file.* that differ from the pinned data \\(LICENSE\\); pass --force"):
        fetch.fetch_neusight(dest=dest, base_url=root.as_uri(), manifest=manifest, progress=False)
    assert (dest / "LICENSE").read_bytes() == b"MINE\n"
    r = fetch.fetch_neusight(dest=dest, force=True, base_url=root.as_uri(), manifest=manifest, progress=False)
    assert r["downloaded"] == 3 and (dest / "LICENSE").read_bytes() == files["LICENSE"]


def test_urls_are_pinned_and_quoted():
    seen = []

    def opener(url):
        seen.append(url)
        raise OSError("offline")

    manifest = {"folder": "scripts/asplos", "files": {"data/x y.csv": {"sha256": "0" * 64}}}
    with pytest.raises(KitError, match="could not download .*offline"):
        fetch.fetch_neusight(dest="/tmp/unused-kit-fetch", manifest=manifest, opener=opener, progress=False)
    assert seen == ["https://raw.githubusercontent.com/sitar-lab/NeuSight/"
                    "6945927d9afcca2b9daf021f8395e53edc5b4eef/scripts/asplos/data/x%20y.csv"]


def test_unsafe_manifest_paths_are_refused(tmp_path):
    manifest = {"files": {"../evil": {"sha256": "0" * 64}}}
    with pytest.raises(KitError, match="unsafe path"):
        fetch.fetch_neusight(dest=tmp_path, manifest=manifest, opener=lambda u: None, progress=False)


@pytest.mark.skipif(not (NEUSIGHT / "data").is_dir(), reason="NeuSight shared data not present")
def test_shipped_manifest_matches_the_reference_copy():
    manifest = fetch.load_manifest()
    assert manifest["commit"] == "6945927d9afcca2b9daf021f8395e53edc5b4eef"
    on_disk = {p.relative_to(NEUSIGHT).as_posix() for p in NEUSIGHT.rglob("*") if p.is_file()}
    assert set(manifest["files"]) == on_disk
    for rel in sorted(on_disk)[::40]:  # hash a sample (the whole copy is 142 MB)
        assert fetch.sha256_of(NEUSIGHT / rel) == manifest["files"][rel]["sha256"], rel


def test_a_manifest_is_not_built_from_a_folder_a_fetch_left_unfinished(tmp_path):
    (tmp_path / "LICENSE").write_text("MIT\n")
    assert list(fetch.build_manifest(tmp_path)["files"]) == ["LICENSE"]
    (tmp_path / fetch.INCOMPLETE_MARK).write_text("unfinished\n")
    with pytest.raises(KitError, match="kit-fetch-incomplete: a `kit data fetch` into it did not finish"):
        fetch.build_manifest(tmp_path)


def test_the_manifest_command_prints_a_kit_error_in_one_line(tmp_path, capsys, monkeypatch):
    # `python -m kit.data.fetch manifest DIR` on an unfinished fetch had ended in a traceback;
    # the shipped manifest must stay as it was
    monkeypatch.setattr(fetch, "MANIFEST_PATH", tmp_path / "never.json")
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "LICENSE").write_text("MIT\n")
    (tmp_path / "data" / fetch.INCOMPLETE_MARK).write_text("unfinished\n")
    assert fetch.main(["manifest", str(tmp_path / "data")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("kit.data.fetch: error: ") and "kit-fetch-incomplete" in err
    assert len(err.strip().splitlines()) == 1 and not (tmp_path / "never.json").exists()
