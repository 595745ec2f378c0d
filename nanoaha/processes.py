"""Processes of this machine: whether one still runs (a stale grid lock, a preparer's left-over staging folder)."""
import os


def pid_alive(pid):
    """Whether a process with this pid exists here (one of another user counts: it exists)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
