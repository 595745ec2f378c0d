"""The preparers' command lines when something goes wrong: an interrupted or failed re-preparation
leaves the previous corpus whole and says so in one line."""
import os
import signal

import pytest

from data.tokens import STAGING
from helpers import Script, run_script, write_jsonl

# data/python_stdlib/prepare.py run as its command line, its source slowed down: after 300 files (several of
# the pool's chunks: two encoding processes are at work) it says so and waits, so that the test's signal comes
# while the preparer encodes, every time
SLOW_STDLIB = """
import runpy, sys, time
import data.prepare
read = data.prepare.read_documents

def slow(*args, **kwargs):
    for i, doc in enumerate(read(*args, **kwargs)):
        if i == 300:
            print("300 documents read", flush=True)
            time.sleep(300)
        yield doc

data.prepare.read_documents = slow
sys.argv[0] = "data/python_stdlib/prepare.py"
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def snapshot(folder):
    return {name: (folder / name).read_bytes() if (folder / name).is_file() else "a folder"
            for name in sorted(os.listdir(folder))}


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_an_interrupted_stdlib_reprepare_leaves_the_previous_corpus(tmp_path, signum):
    out = tmp_path / "stdlib"
    done = run_script("data/python_stdlib/prepare.py", f"--out_dir={out}", "--max_tokens=100000", "--num_proc=1")
    assert done.returncode == 0, done.stderr
    before = snapshot(out)
    with Script("-c", SLOW_STDLIB, f"--out_dir={out}", "--num_proc=2") as script:
        script.wait_for(f"preparing {out}")
        script.wait_for("300 documents read")
        assert any(name.startswith(STAGING) for name in os.listdir(out))  # half-written token files in there
        script.send_signal(signum)
        status, _, stderr = script.finish(timeout=60)
    name = "SIGTERM" if signum == signal.SIGTERM else "SIGINT"
    assert status == 128 + signum, stderr
    assert stderr.strip().splitlines()[-1] == (f"error: interrupted (SIGTERM); the corpus in {out} is unchanged"
                                               if name == "SIGTERM" else
                                               f"error: interrupted; the corpus in {out} is unchanged")
    assert "Traceback" not in stderr
    assert snapshot(out) == before  # byte for byte, and the staging folder is gone


def test_a_bad_json_line_ends_a_reprepare_in_one_line(tmp_path):
    source, out = tmp_path / "docs.jsonl", tmp_path / "out"
    write_jsonl(source, [f"document {i} " * 10 for i in range(600)])
    assert run_script("data/prepare.py", source, f"--out_dir={out}", "--encoding=bytes").returncode == 0
    before = snapshot(out)
    lines = source.read_text().splitlines(keepends=True)
    source.write_text("".join(lines[:500] + ["not json\n"] + lines[501:]))
    done = run_script("data/prepare.py", source, f"--out_dir={out}", "--encoding=bytes")
    assert done.returncode == 1
    errors = [line for line in done.stderr.splitlines() if "error" in line.lower()]
    assert len(errors) == 1 and errors[0].startswith(f"error: {source}:501 is not valid JSON")
    assert errors[0].endswith(f"; the corpus in {out} is unchanged") and "Traceback" not in done.stderr
    assert snapshot(out) == before
