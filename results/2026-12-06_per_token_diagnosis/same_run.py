"""The re-run against the grid's run of the same command: every evaluation's val loss, key-token and other
loss and global share, from the two logs (the re-run's also prints the repeat probe, which the first run's code
did not have). usage: same_run.py ORIGINAL_LOG RERUN_LOG"""
import re
import sys

PATTERN = re.compile(r"^step (\d+): val loss ([\d.]+) \(key tokens ([\d.]+), other ([\d.]+)\).*global ([\d.]+)%")


def evaluations(path):
    found = {}
    for line in open(path):
        m = PATTERN.match(line)
        if m:
            found[int(m.group(1))] = m.groups()[1:]
    return found


original, rerun = (evaluations(p) for p in sys.argv[1:3])
steps = sorted(set(original) & set(rerun))
differ = [s for s in steps if original[s] != rerun[s]]
print(f"{len(steps)} evaluations in both logs (steps {steps[0]}-{steps[-1]}); identical in val loss, key and "
      f"other loss and global share: {len(steps) - len(differ)}; different: {differ or 'none'}")
