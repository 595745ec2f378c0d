"""The preparers' and train.py's command lines when something goes wrong: an interrupted or failed re-preparation
leaves the previous corpus whole and says so in one line; offline, init_from='gpt2' fails in one line at once."""
import os
import signal
import time

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


@pytest.mark.parametrize("signum, group, encoding", [
    (signal.SIGTERM, False, "bytes"), (signal.SIGINT, False, "bytes"),  # to the preparer alone
    (signal.SIGTERM, True, "bytes"), (signal.SIGINT, True, "bytes"),  # to its process group: its workers too
    (signal.SIGTERM, True, "gpt2")],  # as `timeout`, `kill -TERM -PGID` and schedulers send it
    ids=["SIGTERM", "SIGINT", "SIGTERM-group", "SIGINT-group", "SIGTERM-group-gpt2"])
def test_an_interrupted_stdlib_reprepare_leaves_the_previous_corpus(tmp_path, request, signum, group, encoding):
    """A group SIGTERM killed the encoding workers with their chunks, and the pool waited for them until SIGKILL
    (5 of 5), leaving the staging folder; a signal to the preparer alone closed and joined the pool, which once
    ran past 60 s under load. The workers now ignore group signals and the preparer kills them, waiting for
    nothing they hold."""
    if encoding == "gpt2":
        request.getfixturevalue("gpt2")
    out = tmp_path / "stdlib"
    done = run_script("data/python_stdlib/prepare.py", f"--out_dir={out}", "--max_tokens=100000", "--num_proc=1",
                      f"--encoding={encoding}")
    assert done.returncode == 0, done.stderr
    before = snapshot(out)
    with Script("-c", SLOW_STDLIB, f"--out_dir={out}", "--num_proc=2", f"--encoding={encoding}") as script:
        script.wait_for(f"preparing {out}")
        script.wait_for("300 documents read")
        assert any(name.startswith(STAGING) for name in os.listdir(out))  # half-written token files in there
        if group:
            os.killpg(script.proc.pid, signum)
        else:
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


def test_init_from_gpt2_offline_fails_in_one_line_at_once(tmp_path):
    """No network (the hub's address refuses connections) and an empty Hugging Face cache: before, the hub
    client retried 5 times (11 lines, 30 s of waiting) and only then told the error."""
    corpus = tmp_path / "corpus"
    write_jsonl(tmp_path / "docs.jsonl", [f"document {i} " * 30 for i in range(40)])
    assert run_script("data/prepare.py", tmp_path / "docs.jsonl", f"--out_dir={corpus}", "--encoding=bytes",
                      "--val_fraction=0.2").returncode == 0
    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")}
    env.update(HF_HOME=str(tmp_path / "hf_home"), HF_ENDPOINT="http://127.0.0.1:9")  # port 9: nothing listens
    start = time.monotonic()
    done = run_script("train.py", "configs/gpt2_finetune_routed.py", f"--data_dir='{corpus}'",
                      f"--out_dir='{tmp_path / 'out'}'", "--device='cpu'", "--compile=False", "--dtype='float32'",
                      "--block_size=64", "--window=16", "--batch_size=1", "--max_iters=1", "--tensorboard=False",
                      env=env, timeout=120)
    elapsed = time.monotonic() - start
    assert done.returncode == 1
    [line] = done.stderr.splitlines()  # one line, no retries logged
    assert line.startswith("error: cannot load GPT-2 weights 'gpt2': not in the Hugging Face cache, and "
                           "http://127.0.0.1:9 is unreachable: ")
    assert line.endswith("; connect to the internet once to download 'gpt2' into the Hugging Face cache, or pass "
                         "--init_from=hf:PATH with a GPT-2 saved by save_pretrained()")
    # The one line is what tells the retries apart (they logged 11 lines); the time is a bound, not a measurement:
    # importing torch and building the 124M model on a CPU take 6-30 s on a busy 2-core machine, the retries
    # alone slept 23 s. gpt2_state_dict's own share (well under 2 s) is timed in tests/unit/test_data_safety.py.
    assert elapsed < 40, elapsed
