"""One runner per grid folder: compare.py holds an flock on OUT/<grid>/.compare.lock while it trains and
evaluates, so two runners never train into the same run folders. The file names the holder (pid, host, start
time) for the refusal message. The kernel drops the flock when the holder dies (even on SIGKILL), so a lock
left by a killed runner is stale: the next runner takes it over and says whose it was. On a clean exit (signals
included: compare.py's handler lets the runner finish) the file is emptied and the flock released."""
import fcntl
import json
import os
import socket
import sys
import time

from nanoaha.grid.gridfile import GridError
from data.processes import pid_alive

LOCK_NAME = ".compare.lock"


def describe_holder(holder):
    return (f"pid {holder.get('pid', '?')} on {holder.get('host', '?')}, started {holder.get('started', '?')}"
            if holder else "a process that has not written its name yet")


class GridLock:
    """with GridLock(folder): ... -- refuses (GridError) while another process holds it."""

    def __init__(self, folder, log=None):
        self.folder, self.path, self.fd = folder, os.path.join(folder, LOCK_NAME), None
        self.log = log or (lambda line: print(line, file=sys.stderr, flush=True))

    def _holder(self):
        try:
            os.lseek(self.fd, 0, os.SEEK_SET)
            text = os.read(self.fd, 4096).decode(errors="replace")
            return json.loads(text) if text.strip() else None
        except (ValueError, OSError):
            return {"pid": "?", "host": "?", "started": "? (unreadable lock file)"}

    def acquire(self):
        os.makedirs(self.folder, exist_ok=True)
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = self._holder()
            os.close(self.fd)
            self.fd = None
            raise GridError(f"{self.folder} is in use by another compare.py ({describe_holder(holder)}): wait for "
                            f"it to finish or stop it (kill -TERM {holder.get('pid') if holder else 'PID'})") from None
        previous = self._holder()
        if previous:  # left by a runner that died without releasing it (the kernel dropped its flock)
            here = previous.get("host") == socket.gethostname()
            orphans = [pid for pid in previous.get("children") or [] if here and isinstance(pid, int)
                       and pid_alive(pid)]
            if orphans:  # its trainings run in sessions of their own: a SIGKILL of the runner leaves them running
                fcntl.flock(self.fd, fcntl.LOCK_UN)  # the file keeps naming them
                os.close(self.fd)
                self.fd = None
                raise GridError(f"{self.folder}: the runner that held it ({describe_holder(previous)}) is gone but "
                                f"its processes {', '.join(map(str, orphans))} still write into its run folders: "
                                f"stop them first (kill -TERM {' '.join(map(str, orphans))})")
            dead = not here or not isinstance(previous.get("pid"), int) or not pid_alive(previous["pid"])
            self.log(f"taking over a stale lock {self.path} from {describe_holder(previous)} "
                     f"({'no longer running' if dead else 'not holding it'})")
        self.me = {"pid": os.getpid(), "host": socket.gethostname(), "started": time.strftime("%Y-%m-%d %H:%M:%S")}
        self._write(self.me)
        return self

    def _write(self, holder):
        os.ftruncate(self.fd, 0)
        os.lseek(self.fd, 0, os.SEEK_SET)
        os.write(self.fd, (json.dumps(holder) + "\n").encode())
        os.fsync(self.fd)

    def record_children(self, pids):
        """The processes the runner is running now (runner.child_hook), so that if the runner is killed, the
        next one does not start while they still write."""
        if self.fd is not None:
            self._write({**self.me, "children": list(pids)})

    def release(self):
        if self.fd is not None:
            os.ftruncate(self.fd, 0)  # emptied, not removed: removing a locked file lets two runners lock two files
            fcntl.flock(self.fd, fcntl.LOCK_UN)
            os.close(self.fd)
            self.fd = None

    def __enter__(self):
        return self.acquire()

    def __exit__(self, *exc):
        self.release()
