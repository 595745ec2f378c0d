"""A test's subprocess that cannot hang the suite: it runs in a session of its own, so a timeout kills it with
every process it started and fails the test (killing only the parent left its children holding the pipes, and
the test waited on reading them)."""
import os
import signal
import subprocess

import pytest


def run_in_own_session(cmd, timeout, **popen):
    """subprocess.run(cmd, **popen) with a timeout that kills cmd's whole process group and fails the test,
    showing the end of what it wrote (when piped)."""
    proc = subprocess.Popen(cmd, start_new_session=True, **popen)
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        stdout, stderr = proc.communicate()
        tail = "\n".join((s if isinstance(s, str) else s.decode(errors="replace"))[-3000:]
                         for s in (stdout, stderr) if s)
        pytest.fail(f"{' '.join(map(str, cmd))[:200]} ran past {timeout} s (killed with its children)\n{tail}")
    return subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)
