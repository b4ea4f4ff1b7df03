"""The one way dsh's own code touches a path the workspace can influence.

A project's instruction files, its ``.mcp.json``, its hooks, agent files, skills, the memory
file, attachments named by path and the files a tool reads or writes all lie in a folder that
a confined command may have written. Reading them by name (``open(path)``, ``realpath`` then
``open``) follows whatever symbolic link the command left there, and a check of the name
before the open is a race by construction. So every such path is opened here:

* **resolved beneath a root directory descriptor**, in one kernel call where Linux has it
  (``openat2`` with ``RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS``), else by
  a walk that opens one component at a time with ``O_NOFOLLOW`` from the descriptor of the
  one before; a ``..`` component, an absolute path or any symbolic link on the way is
  :class:`Refused`;
* **then used by descriptor**, never opened again by name: :func:`read` reads the descriptor it
  opened (bounded, regular files only, a FIFO never blocks), :func:`write` replaces a file by
  a rename inside the directory descriptor it resolved, :func:`remove` and :func:`rename`
  unlink and move a regular file by its folders' descriptors, and :func:`open_beneath` gives
  the descriptor itself (``O_APPEND`` for a log-like file);
* **never one of dsh's protected paths**: where the opened descriptor really is (the kernel's
  own name for it, ``/proc/self/fd/N``) is checked against :func:`protected_paths` — dsh's
  config directory with its key store, ``$DSH_CONFIG``, the session and attachment store, and
  :data:`HOME_SECRETS` — whatever the caller asked.

Errors are :class:`OSError`: :class:`Refused` (its ``why`` says which rule), or the kernel's
own (``FileNotFoundError``, ``IsADirectoryError``…), :class:`~dsh.core.files.NotRegular` and
:class:`~dsh.core.files.TooLarge` as :func:`dsh.core.files.read_regular` raises them. Each
caller turns them into its own error naming the file.
"""

from __future__ import annotations

import errno
import os
import stat
import sys

from dsh.core import files

#: Files and folders under the home directory that hold credentials, or that a program runs
#: on its own later (shell and git start-up files): dsh's own code never reads or writes them
#: through this API, and the sandbox never grants them. Relative to ``$HOME``.
HOME_SECRETS: tuple[str, ...] = (
    ".ssh", ".gnupg", ".aws", ".azure", ".kube", ".docker", ".netrc", ".git-credentials",
    ".pgpass", ".pypirc", ".npmrc", ".config/gcloud", ".config/gh", ".config/git",
    ".password-store", ".local/share/keyrings", ".gitconfig", ".bashrc", ".bash_profile",
    ".bash_login", ".profile", ".zshrc", ".zshenv", ".zprofile", ".zlogin", ".config/fish",
)

#: The project's persistence paths (defined in :mod:`dsh.core.files`, which every run imports).
PERSISTENCE = files.PERSISTENCE

RESOLVE_NO_MAGICLINKS = 0x02
RESOLVE_NO_SYMLINKS = 0x04
RESOLVE_BENEATH = 0x08
#: ``openat2``'s number: the same in the generic table every 64-bit Linux port uses.
SYS_OPENAT2 = 437

_openat2_state: list[object] = []  # [] not tried yet; [fn] works; [None] unavailable


class Refused(OSError):
    """A path this API will not open: ``why`` says which rule (it leaves the root, it goes
    through a symbolic link, it is one of dsh's protected paths)."""

    def __init__(self, why: str) -> None:
        super().__init__(errno.EPERM, why)
        self.why = why

    def __str__(self) -> str:
        return self.why


_PROTECTED_ENV = ("HOME", "XDG_CONFIG_HOME", "DSH_CONFIG", "DSH_HOME", "XDG_DATA_HOME")
_protected_cache: dict[tuple[str | None, ...], tuple[str, ...]] = {}


def protected_paths() -> tuple[str, ...]:
    """dsh's own files and the home secrets, as real paths: the config directory (which
    holds the key store and the trust records), ``$DSH_CONFIG``, the data directory (sessions
    and attachments, ``$DSH_HOME``) and :data:`HOME_SECRETS`. Computed once per value of the
    environment variables that place them."""
    env = tuple(os.environ.get(k) for k in _PROTECTED_ENV)
    found = _protected_cache.get(env)
    if found is None:
        if len(_protected_cache) > 16:
            _protected_cache.clear()
        found = _protected_cache[env] = _protected_now()
    return found


def _protected_now() -> tuple[str, ...]:
    home = os.path.expanduser("~")
    xdg_config = os.environ.get("XDG_CONFIG_HOME") or os.path.join(home, ".config")
    data = os.environ.get("DSH_HOME") or os.path.join(
        os.environ.get("XDG_DATA_HOME") or os.path.join(home, ".local/share"), "dsh")
    found = [os.path.join(xdg_config, "dsh"), os.environ.get("DSH_CONFIG") or "", data,
             *(os.path.join(home, s) for s in HOME_SECRETS)]
    out: list[str] = []
    for p in found:
        if p:
            real = os.path.realpath(p)
            if real not in out:
                out.append(real)
    return tuple(out)


def within(path: str, root: str) -> bool:
    """Whether the absolute ``path`` is ``root`` or lies under it (by name)."""
    return path == root or path.startswith(root.rstrip("/") + "/")


def protected_by(path: str) -> str | None:
    """The protected path that ``path`` (a real path) is, or lies in; else ``None``."""
    for p in protected_paths():
        if within(path, p):
            return p
    return None


def parts_of(rel: str | os.PathLike[str]) -> list[str]:
    """The components of ``rel``, a path relative to a root; :class:`Refused` when it is
    absolute, holds a NUL or a ``..`` component (``.`` and empty components are dropped)."""
    text = os.fspath(rel)
    if "\0" in text:
        raise Refused("the path holds a NUL byte")
    if text.startswith("/"):
        raise Refused("it is an absolute path; only a path relative to the folder is opened")
    parts = [p for p in text.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise Refused("it leaves the folder through '..'")
    return parts


def _openat2() -> object:
    """``(syscall, open_how type, get_errno)`` once ``ctypes`` found them, else ``None``."""
    if not _openat2_state:
        fn: object = None
        if sys.platform.startswith("linux"):
            try:
                import ctypes

                libc = ctypes.CDLL(None, use_errno=True)
                call = libc.syscall
                call.restype = ctypes.c_long
                call.argtypes = (ctypes.c_long, ctypes.c_int, ctypes.c_char_p, ctypes.c_void_p,
                                 ctypes.c_size_t)
                fn = (call, ctypes.c_uint64 * 3, ctypes.get_errno, ctypes.addressof)
            except (OSError, AttributeError):  # pragma: no cover - a libc without syscall()
                fn = None
        _openat2_state.append(fn)
    return _openat2_state[0]


def _try_openat2(dfd: int, rel: str, flags: int, mode: int) -> int | None:
    """``openat2`` beneath ``dfd``, or ``None`` where the kernel lacks it. Its refusals
    become :class:`Refused`."""
    found = _openat2()
    if found is None:
        return None
    call, how_type, get_errno, addressof = found  # type: ignore[misc]
    resolve = RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS | RESOLVE_NO_SYMLINKS
    how = how_type(flags, mode if flags & os.O_CREAT else 0, resolve)
    fd = call(SYS_OPENAT2, dfd, os.fsencode(rel), addressof(how), 24)
    if fd >= 0:
        return int(fd)
    err = get_errno()
    if err == errno.ENOSYS:  # no openat2 here (a kernel before 5.6): remember, use the walk
        _openat2_state[0] = None
        return None
    if err == errno.EXDEV:
        raise Refused("it leads out of the folder")
    if err == errno.ELOOP or (err == errno.ENOTDIR and _is_link(dfd, rel)):
        raise Refused("it goes through a symbolic link (links are not followed)")
    raise OSError(err, os.strerror(err), rel)


def _walk_open(dfd: int, parts: list[str], flags: int, mode: int) -> int:
    """The fallback: each directory opened from the one before with ``O_NOFOLLOW``."""
    cur = dfd
    try:
        for part in parts[:-1]:
            try:
                nxt = os.open(part, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC,
                              dir_fd=cur)
            except OSError as exc:
                if exc.errno in (errno.ELOOP, errno.ENOTDIR) and _is_link(cur, part):
                    raise Refused("it goes through a symbolic link (links are not followed)") \
                        from None
                raise
            if cur != dfd:
                os.close(cur)
            cur = nxt
        try:
            return os.open(parts[-1], flags | os.O_NOFOLLOW | os.O_CLOEXEC, mode, dir_fd=cur)
        except OSError as exc:
            last = parts[-1]
            if exc.errno == errno.ELOOP or (exc.errno == errno.ENOTDIR and _is_link(cur, last)):
                raise Refused("it goes through a symbolic link (links are not followed)") \
                    from None
            raise
    finally:
        if cur != dfd:
            os.close(cur)


def _is_link(dfd: int, name: str) -> bool:
    try:
        return stat.S_ISLNK(os.stat(name, dir_fd=dfd, follow_symlinks=False).st_mode)
    except OSError:
        return False


def where(fd: int) -> str:
    """The kernel's own name for what ``fd`` is open on (``/proc/self/fd/N``)."""
    try:
        return os.readlink(f"/proc/self/fd/{fd}")
    except OSError:  # pragma: no cover - no /proc: nothing more to learn than the walk did
        return ""


def _root_fd(root: str | os.PathLike[str] | int) -> tuple[int, bool]:
    if isinstance(root, int):
        return root, False
    return os.open(root, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC), True


def open_beneath(root: str | os.PathLike[str] | int, rel: str | os.PathLike[str],
                 flags: int = os.O_RDONLY, mode: int = 0o666) -> int:
    """A descriptor of ``rel`` beneath the folder ``root`` (a path, or a descriptor of the
    folder), opened with ``flags`` (``O_NOFOLLOW`` and ``O_CLOEXEC`` always added). The empty
    path or ``.`` is the folder itself. :class:`Refused` for ``..``, an absolute path, a
    symbolic link anywhere on the way, or a protected path (checked on the descriptor)."""
    parts = parts_of(rel)
    dfd, own = _root_fd(root)
    try:
        if not parts:
            fd = os.open(".", flags | os.O_CLOEXEC, dir_fd=dfd)
        else:
            fd = _try_openat2(dfd, "/".join(parts), flags | os.O_CLOEXEC | os.O_NOFOLLOW, mode)
            if fd is None:
                fd = _walk_open(dfd, parts, flags, mode)
    finally:
        if own:
            os.close(dfd)
    real = where(fd)
    hit = protected_by(real) if real.startswith("/") else None
    if hit is not None:
        os.close(fd)
        raise Refused(f"it is one of dsh's protected paths ({hit}); dsh never reads or "
                      "writes them for a project")
    return fd


def read(root: str | os.PathLike[str] | int, rel: str | os.PathLike[str],
         cap: int | None = None) -> bytes:
    """The bytes of the regular file ``rel`` beneath ``root``, at most ``cap`` (the bound of
    :func:`dsh.core.files.read_regular`, on the descriptor this call opened)."""
    fd = open_beneath(root, rel, os.O_RDONLY | os.O_NONBLOCK)
    try:
        return files.read_fd(fd, cap)
    finally:
        os.close(fd)


def open_dir(root: str | os.PathLike[str] | int, rel: str | os.PathLike[str], *,
             create: bool = False) -> int:
    """A descriptor (``O_RDONLY | O_DIRECTORY``) of the folder ``rel`` beneath ``root``;
    missing folders are made one at a time (mode 0777 less the umask) when ``create``."""
    parts = parts_of(rel)
    dfd, own = _root_fd(root)
    cur = os.open(".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=dfd)
    if own:
        os.close(dfd)
    try:
        for part in parts:
            try:
                nxt = open_beneath(cur, part, os.O_RDONLY | os.O_DIRECTORY)
            except FileNotFoundError:
                if not create:
                    raise
                try:
                    os.mkdir(part, 0o777, dir_fd=cur)
                except FileExistsError:
                    pass
                nxt = open_beneath(cur, part, os.O_RDONLY | os.O_DIRECTORY)
            os.close(cur)
            cur = nxt
    except BaseException:
        os.close(cur)
        raise
    return cur


def write(root: str | os.PathLike[str] | int, rel: str | os.PathLike[str], data: bytes, *,
          create_dirs: bool = False, mode: int = 0o666) -> os.stat_result | None:
    """Replace the file ``rel`` beneath ``root`` with ``data``: written to a new file in the
    same folder (by its descriptor), then renamed over the name, so a reader sees the old
    bytes or the new and a hard link keeps the old. The old file's permission bits are kept
    (``mode`` for a new one). Returns the old file's ``lstat`` (``None`` when it was created).
    Refuses a folder, a symbolic link, a non-regular file and the protected paths."""
    folder, name = _split(rel)
    dfd = open_dir(root, folder, create=create_dirs)
    try:
        return _replace(dfd, name, data, mode)
    finally:
        os.close(dfd)


def _split(rel: str | os.PathLike[str]) -> tuple[str, str]:
    """``rel``'s folder and name; the folder itself is refused as not a file."""
    parts = parts_of(rel)
    if not parts:
        raise IsADirectoryError(errno.EISDIR, "the folder itself is not a file")
    return "/".join(parts[:-1]), parts[-1]


def _leaf(dfd: int, name: str) -> os.stat_result | None:
    """The ``lstat`` of the regular file ``name`` in the folder ``dfd`` (``None``: there is
    none), after refusing a protected path, a folder, a symbolic link or another kind."""
    hit = protected_by(os.path.join(where(dfd), name))
    if hit is not None:
        raise Refused(f"it is one of dsh's protected paths ({hit}); dsh never reads or "
                      "writes them for a project")
    try:
        old = os.stat(name, dir_fd=dfd, follow_symlinks=False)
    except FileNotFoundError:
        return None
    if stat.S_ISDIR(old.st_mode):
        raise IsADirectoryError(errno.EISDIR, "it is a folder, not a file")
    if stat.S_ISLNK(old.st_mode):
        raise Refused("it goes through a symbolic link (links are not followed)")
    if not stat.S_ISREG(old.st_mode):
        raise files.NotRegular(files.kind_of(old.st_mode))
    return old


def _replace(dfd: int, name: str, data: bytes, mode: int) -> os.stat_result | None:
    old = _leaf(dfd, name)
    tmp = f".{name[:200]}.dsh-{os.urandom(4).hex()}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                 mode, dir_fd=dfd)
    try:
        with os.fdopen(fd, "wb") as f:
            if old is not None:
                os.fchmod(f.fileno(), stat.S_IMODE(old.st_mode) & 0o777)
            f.write(data)
        os.rename(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
    except BaseException:
        try:
            os.unlink(tmp, dir_fd=dfd)
        except OSError:
            pass
        raise
    return old


def _missing(rel: str | os.PathLike[str]) -> FileNotFoundError:
    return FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), os.fspath(rel))


def remove(root: str | os.PathLike[str] | int, rel: str | os.PathLike[str]) -> os.stat_result:
    """Unlink the regular file ``rel`` beneath ``root`` by its folder's descriptor; returns its
    ``lstat`` (a caller undoing the removal recreates it with that mode). Refuses a folder,
    a symbolic link (removing one is easily taken for removing its target), any other
    non-regular file and the protected paths. A name swapped between the check and the
    unlink is only a name: ``unlink`` never follows it, and fails on a folder."""
    folder, name = _split(rel)
    dfd = open_dir(root, folder)
    try:
        old = _leaf(dfd, name)
        if old is None:
            raise _missing(rel)
        os.unlink(name, dir_fd=dfd)
        return old
    finally:
        os.close(dfd)


#: ``link`` errors that mean the file system has no hard links for this file (FAT, some
#: FUSE and network mounts; ``EPERM`` also under ``fs.protected_hardlinks``).
_NO_LINKS = {errno.EPERM, errno.EOPNOTSUPP, errno.ENOTSUP, errno.EMLINK}


def rename(root: str | os.PathLike[str] | int, src: str | os.PathLike[str],
           dst: str | os.PathLike[str], *, create_dirs: bool = False) -> None:
    """Move the regular file ``src`` to ``dst`` (both beneath ``root``, by their folders'
    descriptors; ``dst``'s missing folders made when ``create_dirs``), never replacing a
    ``dst`` that exists (:class:`FileExistsError`).

    ``rename(2)`` replaces its target silently and Python has no ``RENAME_NOREPLACE``, so the
    move is ``link`` then ``unlink``: ``link`` refuses an existing ``dst`` in the kernel call
    that makes it (a file appearing meanwhile is never lost) and the file keeps its inode, as
    with a rename; an interruption between the two leaves both names, never neither. Where
    the file system has no hard links it falls back to a check, then ``rename``: a ``dst``
    created in that short window would be replaced."""
    src_folder, src_name = _split(src)
    dst_folder, dst_name = _split(dst)
    sfd = open_dir(root, src_folder)
    try:
        dfd = open_dir(root, dst_folder, create=create_dirs)
        try:
            old = _leaf(sfd, src_name)
            if old is None:
                raise _missing(src)
            if _leaf(dfd, dst_name) is not None:
                raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), os.fspath(dst))
            try:
                os.link(src_name, dst_name, src_dir_fd=sfd, dst_dir_fd=dfd,
                        follow_symlinks=False)
            except OSError as exc:
                if exc.errno not in _NO_LINKS:
                    raise
                os.rename(src_name, dst_name, src_dir_fd=sfd, dst_dir_fd=dfd)
                return
            new = os.stat(dst_name, dir_fd=dfd, follow_symlinks=False)
            if (new.st_dev, new.st_ino, new.st_mode) != (old.st_dev, old.st_ino, old.st_mode):
                # src was swapped after the check (a symbolic link may reuse its inode)
                os.unlink(dst_name, dir_fd=dfd)
                raise Refused("it changed while it was being moved: nothing was moved")
            try:
                os.unlink(src_name, dir_fd=sfd)
            except OSError:
                os.unlink(dst_name, dir_fd=dfd)  # not moved: leave only the old name
                raise
        finally:
            os.close(dfd)
    finally:
        os.close(sfd)
