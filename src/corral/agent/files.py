"""How the agent makes its folders and files: private to it, or given to a job's user, never
through a link a job could have planted (DESIGN.md 6.6).

The agent may run as root. Everything it writes lives in folders only it can write (the data
directory's `run/` and `logs/`), so a job cannot swap a file there for a link to `/etc/shadow`.
The one place it creates something inside a folder a job owns (the attempt's checkpoint folder
under the job's) goes through the folder's descriptor, refuses links, and changes the owner of
what it made only (`lchown`). What it reads from a job's folder is opened without following a
link and without blocking (a FIFO there must not hang the agent), and only if it is a regular
file of bounded size.

Modes: the data directory and the folders on the way to a job's files are 0711 (others may pass
through to the one path they are given, never list or read); files are 0600 unless a job must
read them (the hostfile: 0644); a rank's log belongs to the job's user, 0600.
"""

from __future__ import annotations

import contextlib
import os
import stat
from pathlib import Path

PASS_THROUGH = 0o711
PRIVATE_FILE = 0o600
READABLE_FILE = 0o644


class UnsafePath(OSError):
    """A path where the agent expected its own folder is something else (a link, a file)."""


def private_dir(path: Path, mode: int = PASS_THROUGH, *, exact: bool = False) -> Path:
    """`path` (and its missing parents) as a folder with at most the permissions of `mode` when it
    is this process's own: wider ones are taken away; with `exact`, it gets `mode` exactly (the
    agent's data directory must let jobs pass through to their logs and checkpoints)."""
    made = not path.exists()
    path.mkdir(parents=True, exist_ok=True)
    info = os.lstat(path)
    if stat.S_ISLNK(info.st_mode):
        return path  # an operator's link (e.g. to a bigger disk): theirs to set up
    if not stat.S_ISDIR(info.st_mode):
        raise UnsafePath(f"{path} is not a folder")
    now = stat.S_IMODE(info.st_mode)
    wanted = mode if exact or made else now & mode
    if info.st_uid == os.geteuid() and now != wanted:
        os.chmod(path, wanted)
    return path


def fresh_dirs(root: Path, parts: list[str], mode: int = PASS_THROUGH) -> Path:
    """Folders `root/parts[0]/parts[1]...` that this process makes (or finds, as its own folders,
    never links) with `mode`: for the places only the agent writes."""
    path = private_dir(root)
    for part in parts:
        path = path / part
        with contextlib.suppress(FileExistsError):
            os.mkdir(path, mode)
        info = os.lstat(path)
        if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid():
            raise UnsafePath(f"{path} is not a folder of the agent's user")
        os.chmod(path, mode)
    return path


def give_dir(parent: Path, name: str, uid: int | None, gid: int | None, mode: int = 0o700) -> Path:
    """The folder `parent/name`, made (or found) through `parent`'s descriptor and owned by the
    job's user: `parent` may belong to the job, so a link in its place is refused, not followed."""
    fd = os.open(parent, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    try:
        with contextlib.suppress(FileExistsError):
            os.mkdir(name, mode, dir_fd=fd)
        info = os.stat(name, dir_fd=fd, follow_symlinks=False)
        if not stat.S_ISDIR(info.st_mode):
            raise UnsafePath(f"{parent / name} is not a folder (a link or a file): remove it")
        if uid is not None and gid is not None and (info.st_uid, info.st_gid) != (uid, gid):
            os.chown(name, uid, gid, dir_fd=fd, follow_symlinks=False)
    finally:
        os.close(fd)
    return parent / name


def write_file(path: Path, data: bytes, mode: int = PRIVATE_FILE) -> None:
    """Replace `path` with `data` (a temporary file beside it, then a rename), with `mode`."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, mode)
    try:
        os.fchmod(fd, mode)
        os.write(fd, data)
    finally:
        os.close(fd)
    os.replace(tmp, path)


def open_log(path: Path, uid: int | None, gid: int | None) -> int:
    """A rank's log for appending, owned by the job's user (when the agent can give it) and 0600."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, PRIVATE_FILE)
    os.fchmod(fd, PRIVATE_FILE)
    if uid is not None and gid is not None:
        os.fchown(fd, uid, gid)
    return fd


def read_small(root: Path, parts: list[str], limit: int = 1 << 16) -> bytes | None:
    """The content of `root/parts...`, a regular file a job may have written, or None: each step
    below `root` opened without following a link, no FIFO waited on, at most `limit` bytes."""
    fds: list[int] = []
    try:
        fds.append(os.open(root, os.O_RDONLY | os.O_DIRECTORY))
        for part in parts[:-1]:
            fds.append(os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fds[-1]))
        fds.append(os.open(parts[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=fds[-1]))
        info = os.fstat(fds[-1])
        if not stat.S_ISREG(info.st_mode) or info.st_size > limit:
            return None
        return os.read(fds[-1], limit)
    except OSError:
        return None
    finally:
        for fd in fds:
            os.close(fd)
