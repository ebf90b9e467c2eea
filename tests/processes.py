"""What the tests read of a running process (Linux /proc)."""

from __future__ import annotations

from pathlib import Path


def command_line(pid: int) -> str:
    """The process's command line, its arguments separated by spaces; "" once it is gone."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""
