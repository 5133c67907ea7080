"""`kit data fetch --dest DIR` tells where the data went as an absolute path: the
`export KIT_DATA=...` line it prints works from any folder, not only the one it ran in."""
import os
import shlex
import subprocess
import sys

from kit.cli import main
from kit.data import fetch
from tests.test_data_fetch import _mirror


def _offline(monkeypatch, tmp_path):
    """kit data fetch served from a local mirror: the manifest and URLs of the mirror."""
    root, manifest, files = _mirror(tmp_path)
    monkeypatch.setattr(fetch, "load_manifest", lambda path=None: manifest)
    base = fetch.BASE_URL.rstrip("/")
    monkeypatch.setattr(fetch, "_urlopen", lambda url: open(root / url[len(base) + 1:].replace("%20", " "), "rb"))
    return files


def test_a_relative_dest_is_reported_absolute(tmp_path, monkeypatch):
    files = _offline(monkeypatch, tmp_path)
    monkeypatch.chdir(tmp_path)
    r = fetch.fetch_neusight(dest="ds", progress=False)
    assert os.path.isabs(r["dest"]) and r["dest"] == str(tmp_path / "ds")
    assert all((tmp_path / "ds" / rel).is_file() for rel in files)


def test_the_printed_export_line_works_from_another_folder(tmp_path, monkeypatch, capsys):
    _offline(monkeypatch, tmp_path)
    work = tmp_path / "my work"  # a space: the line quotes the path
    work.mkdir()
    monkeypatch.chdir(work)
    assert main(["data", "fetch", "neusight", "--dest", "ds"]) == 0
    out = capsys.readouterr().out
    line = next(x for x in out.splitlines() if "export KIT_DATA=" in x).split("use it with: ", 1)[1]
    # the line as a shell runs it, from another folder: it names the folder that was filled
    shown = subprocess.run(["sh", "-c", f'{line} && cd / && ls "$KIT_DATA"'], capture_output=True,
                           text=True, check=True).stdout.split()
    assert sorted(shown) == sorted(os.listdir(work / "ds"))
    assert shlex.split(line.removeprefix("export "))[0] == f"KIT_DATA={work / 'ds'}"
