"""`kit train`'s save_bundle replaces a weights folder all or nothing: a failure (a crash: no
cleanup runs) at any step leaves either the old pair or the new one, which load_bundle reads.
Before, the tensors were renamed in, then the manifest: a crash between left the new tensors
beside the old manifest, refused on load ("its sha256 ... is not the ... its manifest.json
records")."""
import errno
import os
import shutil
import tempfile
from dataclasses import replace
from pathlib import Path

import pytest

from kit.errors import KitError
from kit.predict import weights as W


class Crash(BaseException):
    """A process dying at this point: no except clause catches it, no cleanup runs."""


def _bundles():
    """Two bundles that differ in their tensors (so a mismatched pair fails the sha256 check)
    and in their manifest's seed (11 and 22): the shipped weights, and a copy with one tensor
    doubled."""
    import hashlib
    import json

    from safetensors.numpy import load_file, save_file

    shipped = W.load_bundle(W.SHIPPED_DIR)
    other = Path(tempfile.mkdtemp(prefix="kit-swap-test-"))
    try:
        shutil.copy(W.SHIPPED_DIR / W.MANIFEST_FILE, other / W.MANIFEST_FILE)
        tensors = load_file(W.SHIPPED_DIR / W.TENSORS_FILE)
        name = sorted(k for k, v in tensors.items() if v.dtype.kind == "f")[0]
        tensors[name] = tensors[name] * 2
        save_file(tensors, other / W.TENSORS_FILE)
        manifest = json.loads((other / W.MANIFEST_FILE).read_text())
        manifest["sha256"] = {W.TENSORS_FILE: hashlib.sha256((other / W.TENSORS_FILE).read_bytes()).hexdigest()}
        (other / W.MANIFEST_FILE).write_text(json.dumps(manifest))
        doubled = W.load_bundle(other)
    finally:
        shutil.rmtree(other)
    return (replace(shipped, manifest={**shipped.manifest, "seed": 11}),
            replace(doubled, manifest={**doubled.manifest, "seed": 22}))


def _crashing_at(monkeypatch, k):
    """Make the k-th filesystem step that could change the folder (a rename, a replace, an
    exchange, a removal) crash instead; returns the counter."""
    calls = [0]

    def wrap(fn):
        def step(*a, **kw):
            calls[0] += 1
            if calls[0] == k:
                raise Crash
            return fn(*a, **kw)
        return step

    monkeypatch.setattr(os, "replace", wrap(os.replace))
    monkeypatch.setattr(os, "rename", wrap(os.rename))
    monkeypatch.setattr(shutil, "rmtree", wrap(shutil.rmtree))
    if hasattr(W, "_exchange"):
        monkeypatch.setattr(W, "_exchange", wrap(W._exchange))
    return calls


def _seed(folder):
    return W.load_bundle(folder).manifest["seed"]  # every check, the sha256 one too


@pytest.mark.parametrize("exchange", [True, False])
def test_a_crash_at_any_step_leaves_one_whole_pair(tmp_path, monkeypatch, exchange):
    old, new = _bundles()
    if not exchange:  # a file system that cannot exchange: the POSIX fallback (two renames)
        def no_exchange(a, b):
            raise OSError(errno.EINVAL, "no exchange here")
        monkeypatch.setattr(W, "_exchange", no_exchange)
    steps, seen = 0, set()
    for k in range(1, 20):
        out = tmp_path / f"w{k}"
        W.save_bundle(old, out)
        with monkeypatch.context() as m:
            calls = _crashing_at(m, k)
            try:
                W.save_bundle(new, out)
                steps = calls[0]
            except Crash:
                pass
        if steps:  # no step k: the save ran through
            assert _seed(out) == 22
            assert [p.name for p in tmp_path.iterdir() if p.name.startswith(f".w{k}.")] == []
            break
        if not out.exists():
            # only the fallback's window between its two renames: both pairs whole beside it
            assert not exchange
            aside = [p for p in tmp_path.iterdir() if p.name.startswith(f".w{k}.kit-")]
            assert sorted(_seed(p) for p in aside) == [11, 22]
            continue
        seen.add(_seed(out))
        assert seen <= {11, 22}, k
    assert steps >= 1 and seen == {11, 22}  # crashes before the swap (old) and after it (new)


def test_a_finished_save_leaves_nothing_beside_the_folder(tmp_path):
    old, new = _bundles()
    out = tmp_path / "w"
    W.save_bundle(old, out)
    W.save_bundle(new, out)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["w"]
    assert sorted(p.name for p in out.iterdir()) == [W.MANIFEST_FILE, W.TENSORS_FILE]
    assert _seed(out) == 22 and (out / W.TENSORS_FILE).stat().st_mode & 0o777 == 0o644


def test_a_link_to_the_folder_stays_a_link(tmp_path):
    old, new = _bundles()
    W.save_bundle(old, tmp_path / "real")
    (tmp_path / "link").symlink_to(tmp_path / "real")
    W.save_bundle(new, tmp_path / "link")
    assert (tmp_path / "link").is_symlink() and _seed(tmp_path / "real") == 22


def test_the_folder_rules_still_hold_from_python(tmp_path):
    # the whole folder is replaced now, so a folder holding the user's files is refused here too
    old, _ = _bundles()
    out = tmp_path / "w"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    with pytest.raises(KitError, match="holds other files"):
        W.save_bundle(old, out)
    assert (out / "notes.txt").read_text() == "mine"
    with pytest.raises(KitError, match="shipped weights folder"):
        W.save_bundle(old, W.SHIPPED_DIR)
    with pytest.raises(KitError, match="--replace-shipped"):
        W.save_bundle(old, tmp_path / "x", replace_shipped=True)


def test_a_failed_write_keeps_the_old_pair_and_leaves_no_temporary(tmp_path, monkeypatch):
    old, new = _bundles()
    out = tmp_path / "w"
    W.save_bundle(old, out)

    def full(*a, **kw):
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr("safetensors.torch.save_file", full)
    with pytest.raises(KitError, match="No space left"):
        W.save_bundle(new, out)
    assert _seed(out) == 11 and sorted(p.name for p in tmp_path.iterdir()) == ["w"]


@pytest.mark.parametrize("how", ["no-libc", "not-linux"])
def test_no_renameat2_falls_back_rather_than_failing(tmp_path, monkeypatch, how):
    # a C library that cannot be opened (CDLL raises OSError with no errno) had failed the save
    # instead of taking the rename-aside fallback; off Linux, flag 2 is not RENAME_EXCHANGE
    import ctypes
    import sys

    old, new = _bundles()
    out = tmp_path / "w"
    W.save_bundle(old, out)
    if how == "no-libc":
        def no_libc(*a, **kw):
            raise OSError("cannot open the C library")
        monkeypatch.setattr(ctypes, "CDLL", no_libc)
    else:
        monkeypatch.setattr(sys, "platform", "darwin")
    with pytest.raises(OSError) as e:
        W._exchange(tmp_path / "a", tmp_path / "b")
    assert e.value.errno == errno.ENOSYS
    W.save_bundle(new, out)
    assert _seed(out) == 22 and sorted(p.name for p in tmp_path.iterdir()) == ["w"]


@pytest.mark.parametrize("code", [errno.EXDEV, errno.EBUSY])
def test_a_folder_that_cannot_be_renamed_takes_the_files(tmp_path, monkeypatch, code):
    # a mount point (EBUSY) or an overlayfs lower-layer folder (EXDEV) cannot be renamed or
    # exchanged; the files within it can: the save had failed with "cannot write the weights"
    old, new = _bundles()
    out = tmp_path / "w"
    W.save_bundle(old, out)
    real_rename = os.rename

    def no_exchange(a, b):
        raise OSError(code, os.strerror(code))

    def rename(a, b, *r, **kw):
        if Path(a) == out or Path(b) == out:
            raise OSError(code, os.strerror(code))
        return real_rename(a, b, *r, **kw)
    monkeypatch.setattr(W, "_exchange", no_exchange)
    monkeypatch.setattr(os, "rename", rename)
    inode = out.stat().st_ino
    W.save_bundle(new, out)
    assert _seed(out) == 22 and out.stat().st_ino == inode
    assert sorted(p.name for p in tmp_path.iterdir()) == ["w"]
    assert sorted(p.name for p in out.iterdir()) == [W.MANIFEST_FILE, W.TENSORS_FILE]
    assert (out / W.TENSORS_FILE).stat().st_mode & 0o777 == 0o644
    monkeypatch.setattr(W, "_exchange", lambda a, b: (_ for _ in ()).throw(OSError(errno.EINVAL, "no")))
    W.save_bundle(old, out)  # the fallback's rename aside meets the same: the files again
    assert _seed(out) == 11 and sorted(p.name for p in tmp_path.iterdir()) == ["w"]


def test_a_refused_rename_aside_leaves_no_empty_folder(tmp_path, monkeypatch):
    old, new = _bundles()
    out = tmp_path / "w"
    W.save_bundle(old, out)
    real_rename = os.rename

    def rename(a, b, *r, **kw):
        if Path(a) == out:
            raise OSError(errno.EACCES, "Permission denied")
        return real_rename(a, b, *r, **kw)
    monkeypatch.setattr(W, "_exchange", lambda a, b: (_ for _ in ()).throw(OSError(errno.EINVAL, "no")))
    monkeypatch.setattr(os, "rename", rename)
    with pytest.raises(KitError, match="Permission denied"):
        W.save_bundle(new, out)
    assert _seed(out) == 11 and sorted(p.name for p in tmp_path.iterdir()) == ["w"]


def test_loading_a_folder_a_crash_left_aside_names_both_halves(tmp_path, monkeypatch):
    # the fallback's window: a crash between its two renames leaves no folder, the old and the
    # new weights beside it; loading said only "no manifest.json"
    old, new = _bundles()
    out = tmp_path / "w"
    W.save_bundle(old, out)
    monkeypatch.setattr(W, "_exchange", lambda a, b: (_ for _ in ()).throw(OSError(errno.EINVAL, "no")))
    with monkeypatch.context() as m:
        _crashing_at(m, 3)  # 1: the exchange (refused); 2: the old folder renamed aside; 3: the new in
        with pytest.raises(Crash):
            W.save_bundle(new, out)
    aside = sorted(p.name for p in tmp_path.iterdir() if p.name != "w")
    assert not out.exists() and len(aside) == 2
    with pytest.raises(KitError) as e:
        W.load_bundle(out)
    assert all(name in str(e.value) for name in aside) and "stopped midway" in str(e.value)
    assert W.leftovers(tmp_path / "v") == []


def test_the_new_folder_and_the_swap_are_flushed(tmp_path, monkeypatch):
    # a rename is durable once its folder is fsynced; only the two files had been
    old, new = _bundles()
    out = tmp_path / "w"
    W.save_bundle(old, out)
    synced, real_fsync = [], os.fsync

    def fsync(fd):
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        return real_fsync(fd)
    monkeypatch.setattr(os, "fsync", fsync)
    W.save_bundle(new, out)
    assert str(tmp_path) in synced  # the parent, after the swap
    assert any(Path(s).parent == tmp_path and Path(s).name.startswith(".w.kit-new-") for s in synced)
