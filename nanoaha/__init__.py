"""nanoAHA's library: everything the scripts at the root (train, sample, evaluate, prune, compare) share.
The model itself is model.py at the root; the attention kernels are in kernels/."""
