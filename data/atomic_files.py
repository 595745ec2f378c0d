"""Files written atomically: to <path>.tmp, then renamed onto path, so a crash or a signal mid-write leaves the
previous file (or none), never half a file. Checkpoints, run summaries, grid launch records, corpus metadata
and downloads go through here (token files stream through data.tokens.TokenWriter the same way).

write_json writes valid JSON only: a float that is not finite (nan, inf) is written as null, so any JSON reader
reads every file; readers take null as "no number" (a loss that was nan, a rate of no decision)."""
import json
import math
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


def finite_json(value):
    """value with every non-finite float (nan, inf, -inf) replaced by None, in dicts, lists and tuples."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: finite_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite_json(v) for v in value]
    return value


def write_json(path, obj, indent=1):
    """obj as JSON at path, atomically; non-finite floats become null (finite_json), never a bare NaN."""
    def write(tmp):
        with open(tmp, "w") as f:
            json.dump(finite_json(obj), f, indent=indent, allow_nan=False)
            f.write("\n")
    atomic_write(path, write)
