"""`kit data fetch neusight`: download NeuSight's data on a user's machine, pinned and hash-checked.

The files come from github.com/sitar-lab/NeuSight at one pinned commit, folder scripts/asplos/
(the layout kit.data.neusight reads), and each is checked against the sha256 in
neusight_manifest.json (beside this module), which lists every file of the reference copy.
Nothing here touches the network unless fetch_neusight() is called: never at import or test time.

Rebuild the manifest from a verified copy with:  python -m kit.data.fetch manifest DIR
"""
from __future__ import annotations

import hashlib
import http.client
import json
import os
import sys
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

from kit.errors import KitError

NEUSIGHT_REPO = "sitar-lab/NeuSight"
NEUSIGHT_COMMIT = "6945927d9afcca2b9daf021f8395e53edc5b4eef"
NEUSIGHT_FOLDER = "scripts/asplos"
BASE_URL = f"https://raw.githubusercontent.com/{NEUSIGHT_REPO}/{NEUSIGHT_COMMIT}"
MANIFEST_PATH = Path(__file__).with_name("neusight_manifest.json")
ROOT_FILES = {"LICENSE"}  # these live at the repository root, not in scripts/asplos/
# In a folder while a fetch into it runs, removed when every file is there and verified: a fetch
# cut short (Ctrl-C, the network) had left a folder of some files that loaded as the whole data
# (train-collect of the P4's bmm file alone: 17,779 rows, the T4's missing without a word), and
# kit.data.neusight.resolve_data_dir refuses a folder that holds it.
INCOMPLETE_MARK = ".kit-fetch-incomplete"


def fetched_dir() -> Path:
    """Where `kit data fetch neusight` puts the files by default."""
    from kit.data.cache import cache_dir

    return cache_dir() / f"neusight-{NEUSIGHT_COMMIT[:12]}"


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def build_manifest(root: str | Path) -> dict:
    """{"repo", "commit", "folder", "files": {relative path: {"sha256", "bytes"}}} of a local copy."""
    root = Path(root)
    if (root / INCOMPLETE_MARK).exists():  # a fetch left it unfinished: not a verified copy, and the
        # manifest would list the mark itself, which no fetch could then download
        raise KitError(f"{root} holds {INCOMPLETE_MARK}: a `kit data fetch` into it did not finish; "
                       "build the manifest from a complete copy")
    files = {p.relative_to(root).as_posix(): {"sha256": sha256_of(p), "bytes": p.stat().st_size}
             for p in sorted(root.rglob("*")) if p.is_file()}
    if not files:
        raise KitError(f"no files under {root} to build a manifest from")
    return {"repo": NEUSIGHT_REPO, "commit": NEUSIGHT_COMMIT, "folder": NEUSIGHT_FOLDER,
            "files": files}


def load_manifest(path: str | Path = MANIFEST_PATH) -> dict:
    try:
        manifest = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise KitError(f"cannot read the download manifest {path}: {e}") from None
    if not isinstance(manifest, dict) or not isinstance(manifest.get("files"), dict):
        raise KitError(f"download manifest {path} has no 'files' table")
    return manifest


def file_url(base_url: str, manifest: dict, rel: str) -> str:
    upstream = rel if rel in ROOT_FILES else f"{manifest.get('folder', NEUSIGHT_FOLDER)}/{rel}"
    return f"{base_url.rstrip('/')}/{urllib.parse.quote(upstream)}"


def _download(url: str, target: Path, expected: str, opener) -> None:
    """url -> target, atomically, when its sha256 is expected; KitError otherwise (no .part file
    is left behind)."""
    if target.is_dir():  # os.replace cannot put the file there: refused before downloading it
        raise KitError(f"{target} is a folder where the file {target.name} belongs; move it away "
                       "(or choose another --dest) and fetch again")
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise KitError(f"cannot create folder {target.parent}: {e.strerror or e}") from None
    tmp = target.with_name(target.name + ".part")
    h = hashlib.sha256()
    try:
        with opener(url) as response, open(tmp, "wb") as out:
            for block in iter(lambda: response.read(1 << 20), b""):
                h.update(block)
                out.write(block)
    except (urllib.error.URLError, OSError, ValueError, http.client.HTTPException) as e:
        # HTTPException: a connection cut mid-body (IncompleteRead) is no OSError, and had
        # ended the fetch with a traceback, its FILE.part left behind
        tmp.unlink(missing_ok=True)
        reason = getattr(e, "reason", None) or e
        raise KitError(f"could not download {url}: {reason!s}. Check the network, or point KIT_DATA "
                       "at a copy you already have") from None
    except BaseException:  # Ctrl-C, SIGTERM: no half-written FILE.part stays either
        tmp.unlink(missing_ok=True)
        raise
    if h.hexdigest() != expected:
        tmp.unlink(missing_ok=True)
        raise KitError(f"{url}: sha256 {h.hexdigest()[:16]}... does not match the manifest's "
                       f"{expected[:16]}...; the file was not kept")
    try:
        os.replace(tmp, target)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise KitError(f"cannot put the downloaded {target.name} at {target}: "
                       f"{e.strerror or e}") from None


def _urlopen(url: str):
    return urllib.request.urlopen(url, timeout=60)


def fetch_neusight(dest: str | Path | None = None, force: bool = False, base_url: str = BASE_URL,
                   manifest: dict | str | Path | None = None, opener=None,
                   progress: bool | None = None) -> dict:
    """Download every manifest file that is missing or fails its hash into dest; verify the rest.
    In the kit's own cache (dest None) a file that fails its hash is downloaded again; in a
    dest of the caller's, files that differ are replaced only with force (they may be edits)."""
    manifest = manifest if isinstance(manifest, dict) else load_manifest(manifest or MANIFEST_PATH)
    own_cache = dest is None or Path(dest).resolve() == fetched_dir().resolve()  # named, or not
    dest = Path(dest) if dest is not None else fetched_dir()
    if dest.exists() and not dest.is_dir():
        raise KitError(f"--dest {dest} is a file, not a folder; choose a folder to download into")
    created = next((p for p in reversed([dest, *dest.parents]) if not p.exists()), None)
    try:
        return _fetch_into(dest, force, base_url, manifest, opener or _urlopen, progress, own_cache)
    except BaseException:
        try:
            if not any((dest / rel).is_file() for rel in manifest["files"]):
                (dest / INCOMPLETE_MARK).unlink(missing_ok=True)  # none of the data set is there
            if created is not None:  # a failed first download leaves no empty folders behind
                _remove_empty_dirs(created)
        except OSError:
            pass
        raise


def _remove_empty_dirs(top: Path) -> None:
    """rmdir top and the folders under it, deepest first, where empty (files already fetched stay)."""
    if not top.is_dir():
        return
    for p in sorted((d for d in top.rglob("*") if d.is_dir()), key=lambda d: len(d.parts), reverse=True):
        if not any(p.iterdir()):
            p.rmdir()
    if not any(top.iterdir()):
        top.rmdir()


def _fetch_into(dest: Path, force: bool, base_url: str, manifest: dict, opener,
                progress: bool | None, own_cache: bool = False) -> dict:
    files = manifest["files"]
    show = progress if progress is not None else sys.stderr.isatty()
    bar = None
    if show:
        from tqdm import tqdm

        bar = tqdm(total=sum(int(f.get("bytes", 0)) for f in files.values()), unit="B",
                   unit_scale=True, file=sys.stderr, desc="neusight")
    for rel in files:
        if rel.startswith("/") or ".." in Path(rel).parts:
            raise KitError(f"download manifest has an unsafe path {rel!r}")
    same = {rel: not force and (dest / rel).is_file() and sha256_of(dest / rel) == e["sha256"]
            for rel, e in files.items()}  # --force downloads all: no hashing first
    other = sorted(rel for rel in files if (dest / rel).is_file() and not same[rel])
    if other and not force and not own_cache:  # an edit, or a file of one's own: never written over unasked
        if bar is not None:
            bar.close()
        raise KitError(f"{dest} already holds {len(other)} file(s) that differ from the pinned data "
                       f"({', '.join(other[:3])}{' ...' if len(other) > 3 else ''}); pass --force "
                       "(force=True) to replace them, or fetch into another --dest")
    downloaded = verified = 0
    marker = dest / INCOMPLETE_MARK
    marked_before = marker.exists()
    if not all(same.values()):  # files to download: the folder is incomplete until they are all in
        try:
            dest.mkdir(parents=True, exist_ok=True)
            marker.write_text("a `kit data fetch` into this folder has not finished; run it again\n")
        except OSError as e:
            raise KitError(f"cannot write into {dest}: {e.strerror or e}") from None
    try:
        for rel, entry in sorted(files.items()):
            target = dest / rel
            if not force and same[rel]:
                verified += 1
            else:
                _download(file_url(base_url, manifest, rel), target, entry["sha256"], opener)
                downloaded += 1
            if bar is not None:
                bar.update(int(entry.get("bytes", 0)))
    except BaseException:
        # nothing came, so the folder is as it was: unmarked if it was. A copy of scripts/asplos
        # (all the data, no LICENSE: that is at NeuSight's root) fetched into offline had been
        # refused from then on, its first download (LICENSE) failing before any file changed
        if not downloaded and not marked_before:
            marker.unlink(missing_ok=True)
        raise
    if bar is not None:
        bar.close()
    marker.unlink(missing_ok=True)
    # absolute: `export KIT_DATA=ds` printed for --dest ds worked only from the folder it ran in
    return {"dest": os.path.abspath(dest), "commit": manifest.get("commit", NEUSIGHT_COMMIT),
            "files": len(files), "downloaded": downloaded, "verified": verified}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 2 or argv[0] != "manifest":
        print("usage: python -m kit.data.fetch manifest DIR", file=sys.stderr)
        return 2
    try:
        manifest = build_manifest(argv[1])
    except KitError as e:  # one line, as the kit CLI prints it (a folder with no files had raised)
        print(f"kit.data.fetch: error: {e}", file=sys.stderr)
        return 2
    MANIFEST_PATH.write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    print(f"{len(manifest['files'])} files -> {MANIFEST_PATH}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
