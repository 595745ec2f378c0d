"""Files written atomically: to <path>.tmp, then renamed onto path, so a crash or a signal mid-write leaves the
previous file (or none), never half a file. Checkpoints, run summaries, grid launch records, corpus metadata
and downloads go through here (token files stream through data.tokens.TokenWriter the same way)."""
import json
import os


def atomic_write(path, write):
    """write(tmp_path), then rename onto path; on an error the temporary file is removed and path untouched."""
    tmp = path + ".tmp"
    try:
        write(tmp)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def write_json(path, obj, indent=1, allow_nan=True):
    def write(tmp):
        with open(tmp, "w") as f:
            json.dump(obj, f, indent=indent, allow_nan=allow_nan)
            f.write("\n")
    atomic_write(path, write)
