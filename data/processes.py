"""Processes of this machine: whether one still runs (a stale grid lock, a preparer's left-over staging folder)."""
import os


def pid_alive(pid):
    """Whether a process with this pid runs here (one of another user counts). A zombie does not: it has exited
    and waits only for its parent to collect it (an orphan's new parent may never do so in a container)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"  # the state follows the command's name
    except (OSError, IndexError):
        return True  # no /proc (not Linux): os.kill's answer
