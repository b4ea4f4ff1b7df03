"""Stored API keys (issue 17): ``dsh keys set|list|remove|path`` and ``api_key_name``.

Where keys live (:func:`store`):

* the **OS keyring**, through the ``keyring`` library, when it is importable and its backend
  is a real keyring (priority ≥ 1: macOS Keychain, Windows Credential Locker, Secret Service,
  KWallet), or one the user chose explicitly (``PYTHON_KEYRING_BACKEND`` or keyring's config
  file). keyring's own fallbacks (``keyrings.alt``'s plaintext file, priority 0.5) are not
  chosen on their own: the file below is at least as safe. Entries are service ``dsh``,
  username NAME; keyring cannot list entries, so the names are kept in one more entry
  (``dsh:names``, which no NAME can be);
* else an **owner-only file**: ``$XDG_CONFIG_HOME/dsh/keys/keys.json``, mode 0600 in a
  directory of mode 0700. A file or directory that others may read or write, that is not
  owned by the user, or is a symbolic link is refused with a :class:`ConfigError` naming it
  and the fix (``chmod``), before its content is read. Writes take a lock, go to a new 0600
  file and replace the old one (a crash leaves either version whole).

``DSH_KEYS_BACKEND=file|keyring`` overrides the choice. Environment variables still win
over stored keys (``dsh.llm.http.model.HTTPModel.api_key``): a stored key is read only when no
variable holds one, once per model object. Every key read here is registered with
:mod:`dsh.redact` before it is returned, so no message, ledger event or error can show it;
no key is ever put into ``os.environ`` (child processes never see it).

Cheap to import: ``keyring`` is imported only when a key is read or written.
"""

from __future__ import annotations

import json
import os
import re
import stat
from pathlib import Path
from typing import Any
from typing import Protocol

from dsh.core import redact
from dsh.core.errors import ConfigError
from dsh.core.errors import UsageError

SERVICE = "dsh"
#: The keyring entry listing the stored names: not a valid NAME (it has a colon).
INDEX = "dsh:names"
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")
BACKEND_ENV = "DSH_KEYS_BACKEND"
#: The longest key ``dsh keys set`` stores (bytes of ASCII): API keys and tokens are far
#: shorter; a larger "key" is a mistake (a file piped by accident) that every request would
#: carry in a header.
MAX_KEY_BYTES = 8192
#: The largest keys file read (a bounded read: ``keys.json`` is never more than names and keys).
MAX_FILE_BYTES = 4 * 1024 * 1024


def check_name(name: str) -> str:
    """``name`` if it is a valid key name (letters, digits, ``_ . -``; 128 at most)."""
    if not NAME.fullmatch(name):
        raise UsageError(f"invalid key name {name!r}: use letters, digits, '_', '.' and '-' "
                         "(at most 128, starting with a letter or digit)")
    return name


def check_value(value: str) -> str:
    """``value`` if it is not longer than :data:`MAX_KEY_BYTES` (the key is never shown)."""
    if len(value.encode("utf-8", "surrogatepass")) > MAX_KEY_BYTES:
        raise UsageError(f"the key is longer than {MAX_KEY_BYTES} bytes; it was not stored "
                         "(the key is not shown)")
    return value


class KeyStore(Protocol):
    def where(self) -> str: ...
    def get(self, name: str) -> str | None: ...
    def set(self, name: str, value: str) -> None: ...
    def remove(self, name: str) -> bool: ...
    def names(self) -> list[str]: ...


def keys_dir() -> Path:
    """``$XDG_CONFIG_HOME/dsh/keys`` (``~/.config/dsh/keys``)."""
    xdg = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return Path(xdg) / "dsh" / "keys"


def _loose(mode: int, want: int) -> str | None:
    """Why ``mode`` is looser than owner-only ``want`` (``0600``/``0700``), or ``None``."""
    if mode & 0o077:
        return f"mode {stat.S_IMODE(mode):04o}, others may read or change it"
    return None


class FileStore:
    """Keys in ``keys.json`` (``{"version": 1, "keys": {NAME: KEY}}``) in :func:`keys_dir`."""

    def __init__(self, directory: Path | None = None) -> None:
        self.dir = directory or keys_dir()
        self.path = self.dir / "keys.json"

    def where(self) -> str:
        return str(self.path)

    # -- checks -------------------------------------------------------------------------------

    def _check(self, st: os.stat_result, path: Path, kind: str, want: int) -> None:
        fix = f"chmod {want:o} {path}"
        if stat.S_ISLNK(st.st_mode):
            raise ConfigError(f"{path}: the keys {kind} is a symbolic link; dsh will not use it "
                              "(replace it with a real " + kind + ")")
        if kind == "file" and not stat.S_ISREG(st.st_mode):
            raise ConfigError(f"{path}: not a regular file; dsh keeps its keys there")
        if kind == "directory" and not stat.S_ISDIR(st.st_mode):
            raise ConfigError(f"{path}: not a directory; dsh keeps its keys there")
        if hasattr(os, "geteuid") and st.st_uid != os.geteuid():
            raise ConfigError(f"{path}: the keys {kind} belongs to another user (uid "
                              f"{st.st_uid}); dsh will not use it")
        loose = _loose(st.st_mode, want)
        if loose:
            raise ConfigError(f"{path}: the keys {kind} is not private ({loose}); dsh will not "
                              f"read keys from it until it is: {fix}")

    def _check_dir(self) -> bool:
        """The directory is owner-only; ``False`` when it does not exist."""
        try:
            st = os.lstat(self.dir)
        except FileNotFoundError:
            return False
        self._check(st, self.dir, "directory", 0o700)
        return True

    # -- reading ------------------------------------------------------------------------------

    def _load(self) -> dict[str, str]:
        if not self._check_dir():
            return {}
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0))
        except FileNotFoundError:
            return {}
        except OSError as exc:
            if os.path.islink(self.path):
                self._check(os.lstat(self.path), self.path, "file", 0o600)
            raise ConfigError(f"{self.path}: cannot read the keys file: "
                              f"{os.strerror(exc.errno or 0).lower()}") from None
        with os.fdopen(fd, "rb") as f:
            self._check(os.fstat(f.fileno()), self.path, "file", 0o600)
            raw = f.read(MAX_FILE_BYTES + 1)
        if len(raw) > MAX_FILE_BYTES:
            raise ConfigError(f"{self.path}: the keys file is larger than {MAX_FILE_BYTES} "
                              "bytes (damaged); remove it and set the keys again")
        try:
            data = json.loads(raw.decode("utf-8"))
            keys = data["keys"]
            if not isinstance(keys, dict) or not all(
                    isinstance(k, str) and isinstance(v, str) for k, v in keys.items()):
                raise TypeError
        except (ValueError, KeyError, TypeError, RecursionError):  # never the content
            raise ConfigError(f"{self.path}: the keys file is damaged (not dsh's JSON); "
                              "remove it and set the keys again") from None
        for value in keys.values():
            redact.register(value)
        return dict(keys)

    def get(self, name: str) -> str | None:
        return self._load().get(name)

    def names(self) -> list[str]:
        # as the keyring store: only valid names (a hand-edited file's others are not shown)
        return sorted(n for n in self._load() if NAME.fullmatch(n))

    # -- writing ------------------------------------------------------------------------------

    def _update(self, change: Any) -> Any:
        """Apply ``change(keys) -> result`` under the lock and write the keys back."""
        import fcntl
        import tempfile

        if not self._check_dir():
            self.dir.mkdir(parents=True, exist_ok=True, mode=0o700)
            os.chmod(self.dir, 0o700)  # the umask may have taken bits away, never added
            self._check_dir()
        lock = os.open(self.dir / ".lock", os.O_RDWR | os.O_CREAT
                       | getattr(os, "O_NOFOLLOW", 0), 0o600)
        try:
            fcntl.flock(lock, fcntl.LOCK_EX)
            keys = self._load()
            result = change(keys)
            fd, tmp = tempfile.mkstemp(dir=self.dir, prefix=".keys-", suffix=".tmp")  # 0600
            try:
                with os.fdopen(fd, "w", encoding="utf-8") as f:
                    json.dump({"version": 1, "keys": keys}, f, indent=1, sort_keys=True)
                    f.write("\n")
                    f.flush()
                    os.fsync(f.fileno())
                os.replace(tmp, self.path)
            except BaseException:
                try:
                    os.unlink(tmp)
                except OSError:
                    pass
                raise
            return result
        finally:
            os.close(lock)

    def set(self, name: str, value: str) -> None:
        check_value(value)
        redact.register(value)
        self._update(lambda keys: keys.__setitem__(name, value))

    def remove(self, name: str) -> bool:
        return bool(self._update(lambda keys: keys.pop(name, None) is not None))


class KeyringStore:
    """Keys in the OS keyring (``keyring.get_password("dsh", NAME)``)."""

    def __init__(self, keyring: Any) -> None:
        self.keyring = keyring
        self.backend = keyring.get_keyring()

    def where(self) -> str:
        b = type(self.backend)
        return f"keyring {b.__module__}.{b.__qualname__} (service {SERVICE!r})"

    def _call(self, method: str, *args: str) -> Any:
        """``keyring.METHOD(*args)``; a keyring failure (locked, no D-Bus…) is one
        :class:`ConfigError` naming the backend (never the arguments: one may be a key)."""
        from keyring.errors import KeyringError
        from keyring.errors import PasswordDeleteError

        try:
            return getattr(self.keyring, method)(*args)
        except PasswordDeleteError:
            raise
        except KeyringError as exc:
            raise ConfigError(f"{self.where()}: {type(exc).__name__}: "
                              f"{redact.redact(str(exc)) or 'failed'} ({BACKEND_ENV}=file "
                              "keeps keys in a file instead)") from None

    def get(self, name: str) -> str | None:
        value = self._call("get_password", SERVICE, name)
        if value is not None:
            redact.register(value)
        return value if value is None else str(value)

    def names(self) -> list[str]:
        raw = self._call("get_password", SERVICE, INDEX)
        try:
            names = json.loads(raw) if raw else []
        except ValueError:
            names = []
        return sorted({n for n in names if isinstance(n, str) and NAME.fullmatch(n)})

    def _index(self, names: set[str]) -> None:
        self._call("set_password", SERVICE, INDEX, json.dumps(sorted(names)))

    def set(self, name: str, value: str) -> None:
        check_value(value)
        redact.register(value)
        self._call("set_password", SERVICE, name, value)
        self._index({*self.names(), name})

    def remove(self, name: str) -> bool:
        from keyring.errors import PasswordDeleteError

        known = set(self.names())
        try:
            self._call("delete_password", SERVICE, name)
            found = True
        except PasswordDeleteError:
            found = False
        if name in known:
            self._index(known - {name})
        return found or name in known


def usable_keyring(forced: bool = False) -> Any:
    """The ``keyring`` module when it is importable and its backend usable, else ``None``
    (``forced``: any backend that is not keyring's "fail"/"null" one)."""
    try:
        import keyring
        from keyring.backends import fail
    except Exception:  # noqa: BLE001 - not installed, or broken: the file is used
        return None
    try:
        backend = keyring.get_keyring()
    except Exception:  # noqa: BLE001
        return None
    if isinstance(backend, fail.Keyring) or type(backend).__module__.endswith(".null"):
        return None
    chosen = forced or bool(os.environ.get("PYTHON_KEYRING_BACKEND"))
    if not chosen:
        try:
            chosen = keyring.core.load_config() is not None
        except Exception:  # noqa: BLE001
            chosen = False
    priority = getattr(backend, "priority", 0)
    try:
        priority = float(priority)
    except (TypeError, ValueError):
        priority = 0.0
    return keyring if chosen or priority >= 1 else None


def store() -> KeyStore:
    """The key store in use: ``DSH_KEYS_BACKEND`` (``file``/``keyring``), else the OS
    keyring when usable, else the file."""
    choice = os.environ.get(BACKEND_ENV, "").strip().lower()
    if choice not in ("", "auto", "file", "keyring"):
        raise ConfigError(f"{BACKEND_ENV}={choice!r}: expected file, keyring or auto")
    if choice == "file":
        return FileStore()
    kr = usable_keyring(forced=choice == "keyring")
    if kr is not None:
        return KeyringStore(kr)
    if choice == "keyring":
        raise ConfigError(f"{BACKEND_ENV}=keyring, but the keyring library is not installed "
                          "or has no usable backend (pip install keyring)")
    return FileStore()


def get_key(name: str) -> str | None:
    """The stored key ``name`` (registered as a secret), or ``None``."""
    return store().get(check_name(name))
