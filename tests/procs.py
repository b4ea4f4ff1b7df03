"""For the sandbox's tests: what this machine can confine (the markers, its check run once
per test session), and finding processes from outside a sandbox (a confined command runs in
its own PID namespace, so a pid it reports is not one here; tests find its processes by a
marker in their argv)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from dsh.sandbox.spawn import check

CHECK = check()
needs_sandbox = pytest.mark.skipif(not CHECK.get("backend"),
                                   reason=f"no sandbox on this machine: {CHECK.get('why')}")
needs_namespaces = pytest.mark.skipif(
    CHECK.get("namespaces") != "ok",
    reason=f"no user namespaces on this machine: {CHECK.get('namespaces')}")


def alive_with(marker: str) -> list[int]:
    """Pids (as this process sees them) of live processes with ``marker`` in their argv."""
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            cmdline = Path(f"/proc/{entry.name}/cmdline").read_bytes()
            state = Path(f"/proc/{entry.name}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if marker.encode() in cmdline and state != "Z":
            found.append(int(entry.name))
    return found
