"""compare.py as a command: a bad argument or input ends it with one line on stderr, not a traceback."""
import os
import subprocess
import sys

import pytest

from processes import run_in_own_session

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.slow
def test_a_bad_argument_to_compare_ends_with_one_line(tmp_path):
    not_rows = tmp_path / "not_a_record"
    not_rows.mkdir()
    (not_rows / "rows.json").write_text('{"grid": "g", "rows": []}')  # JSON, but no references
    cases = {
        ("configs/grids/tiny.py", "--jbos=2"): "unknown config key 'jbos'; did you mean jobs?",
        ("configs/grids/no_such_grid.py", "--dry_run"): "grid file 'configs/grids/no_such_grid.py' does not exist",
        ("--summary=s", "configs/grids/tiny.py"): "configs/grids/tiny.py/rows.json not found or not JSON",
        ("--summary=s", str(not_rows)): "is not a rows.json that compare.py wrote (KeyError: 'references')",
        ("--summary=s", f"--record_dir={tmp_path / 'a_file' / 'below'}", "results/2026-12-02_stdlib_bpe"):
            "Not a directory",
    }
    (tmp_path / "a_file").write_text("")
    for args, message in cases.items():
        done = run_in_own_session([sys.executable, "compare.py", *args], timeout=120, cwd=ROOT,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert done.returncode == 1 and message in done.stderr, (args, done.stderr)
        assert len(done.stderr.strip().splitlines()) == 1 and "Traceback" not in done.stderr, (args, done.stderr)
    assert not os.path.exists(tmp_path / "a_file" / "below")
