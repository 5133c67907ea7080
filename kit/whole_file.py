"""Output files written whole or not at all.

A file the kit writes for the user (a --trace, a calibration, collect-comm's measurements) goes
to a temporary file beside it, which then replaces it (os.replace: one step on one filesystem).
A write that fails part-way (a full disk, a file-size limit) leaves the earlier file as it was
and no part-written file behind, where writing in place had left a truncated one.

What replacing must not change, as writing in place did not: a symlink's target is the file
replaced (the link stays a link), an earlier file keeps its permissions (a 0600 file stays
private), and a path that is no regular file (a FIFO, /dev/null, /dev/stdout onto a pipe) is
written to as it is: there is no earlier content to keep, and replacing it would put a regular
file where a device or pipe was (as root, /dev/null itself). A hard link's other names keep the
earlier content: replacing gives the path a new file, as editors and `sed -i` do. Where no file
may be made beside it (a folder not ours, holding a file we may write), the file is written in
place, as it had been.
"""
from __future__ import annotations

import os
import secrets
import stat
from pathlib import Path


def replace_file(path, data: bytes, sync: bool = True) -> Path:
    """data as the whole content of path (its folder made when missing); returns path. An
    OSError reaches the caller, with path unchanged and the temporary file removed. sync=False
    skips the fsync (a cache: losing it to a power cut only costs a rebuild)."""
    path = Path(path)
    try:
        now = os.stat(path)  # through symlinks (and /proc's fd links, which realpath cannot name)
    except FileNotFoundError:
        now = None
    if now is not None and not stat.S_ISREG(now.st_mode):
        with open(path, "wb") as f:  # a FIFO or a device: nothing there to keep
            f.write(data)
        return path
    target = Path(os.path.realpath(path))  # a symlink's target is replaced, not the link
    target.parent.mkdir(parents=True, exist_ok=True)
    # a name no other process or write picks, created new (O_EXCL: never a file or link already there)
    tmp = target.with_name(f".{target.name}.{os.getpid()}.{secrets.token_hex(4)}.partial")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)  # the umask's permissions
    except PermissionError:
        if now is None:
            raise
        # a folder we may not add a file to, holding a file we may write: in place, as before
        with open(path, "wb") as f:
            f.write(data)
        return path
    try:
        with open(fd, "wb") as f:
            if now is not None:  # the earlier file's owner where we may give it, and its mode
                try:
                    os.chown(f.fileno(), now.st_uid, now.st_gid)
                except OSError:  # not root: the file is ours, as writing it anew makes it
                    pass
                os.chmod(f.fileno(), stat.S_IMODE(now.st_mode))  # after chown, which clears set-id bits
            f.write(data)
            f.flush()
            if sync:
                os.fsync(f.fileno())
        os.replace(tmp, target)
    except BaseException:  # Ctrl-C too: no part-written file stays
        tmp.unlink(missing_ok=True)
        raise
    return path
