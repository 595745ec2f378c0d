"""Grids of training runs, compared at equal budget; compare.py is the command. One module per concern, each
importing only the ones above it:

    gridfile.py  the grid file format (its docstring), load_grid and its checks, the run order
    plan.py      jobs (one per run and seed), run folders, train.py / evaluate.py commands, what each job needs
    runner.py    running the jobs' processes, a job limit, dependencies first, stopping on request
    tables.py    rows of per-seed results, spreads, same-seed differences and verdicts, the tables, rows.json
    plots.py     the record's plots, drawn from rows
"""
