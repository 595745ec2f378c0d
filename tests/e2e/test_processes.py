import os
import subprocess
import sys
import time

import pytest

from helpers import run_in_own_session


def test_a_timeout_fails_the_test_and_kills_the_children_too(tmp_path):
    # the parent starts a child that would outlive it (and, were the output piped, hold the pipe: the hang the
    # helper exists for; not piped here, so a helper that kills only the parent fails below instead of hanging)
    pid_file = tmp_path / "child.pid"
    script = ("import subprocess, sys, time; child = subprocess.Popen([sys.executable, '-c', 'import time; "
              f"time.sleep(600)']); open({str(pid_file)!r}, 'w').write(str(child.pid)); time.sleep(600)")
    started = time.time()
    with pytest.raises(pytest.fail.Exception, match="ran past 5 s"):  # time enough to start the child
        run_in_own_session([sys.executable, "-c", script], timeout=5)
    assert time.time() - started < 30
    child = int(pid_file.read_text())
    for _ in range(50):  # SIGKILL is delivered at once; the zombie is reaped by init shortly after
        try:
            os.kill(child, 0)
        except ProcessLookupError:
            break
        try:
            if open(f"/proc/{child}/stat").read().split()[2] == "Z":
                break
        except FileNotFoundError:  # reaped between the two looks
            break
        time.sleep(0.1)
    else:
        pytest.fail(f"child {child} still runs")


def test_a_finished_command_returns_its_output_and_status():
    done = run_in_own_session([sys.executable, "-c", "print('hi'); raise SystemExit(3)"], timeout=60,
                              stdout=subprocess.PIPE, text=True)
    assert done.returncode == 3 and done.stdout == "hi\n"


def test_pid_alive_counts_a_running_process_and_neither_a_zombie_nor_a_reaped_one():
    from data.processes import pid_alive
    running = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    done = subprocess.Popen([sys.executable, "-c", "pass"])
    try:
        deadline = time.time() + 30
        while time.time() < deadline and open(f"/proc/{done.pid}/stat").read().rsplit(")", 1)[1].split()[0] != "Z":
            time.sleep(0.05)  # exited, not yet collected: a zombie
        assert pid_alive(running.pid) and not pid_alive(done.pid)
        done.wait()
        assert not pid_alive(done.pid)
    finally:
        running.kill()
        running.wait()
