import json
import os
import signal
import threading
import time

import pytest

import compare
from helpers import ROOT, table_cells, write_grid
from nanoaha.grid import plots, runner, tables
from nanoaha.grid.gridfile import Grid, GridError, load_grid, run_order
from nanoaha.grid.plan import comparable, plan, train_argv, train_state, window_groups
from nanoaha.grid.tables import Row, best_fixed, gap_recovery, results_table, spread


def test_plan_puts_a_dependency_first_and_points_init_from_at_its_checkpoint(tmp_path):
    path = write_grid(tmp_path / "g.py", {"finetuned": {"schedule": "R", "init_from": "run:dense"},
                                          "dense": {"schedule": "G"}, "local": {"schedule": "L"}}, seeds=[1, 2])
    jobs = plan(load_grid(path), str(tmp_path / "out"))
    assert [j.key for j in jobs] == [("dense", 1), ("dense", 2), ("finetuned", 1), ("finetuned", 2),
                                     ("local", 1), ("local", 2)]
    finetuned = jobs[3]
    assert finetuned.deps == [("dense", 2)] and finetuned.kind == "routed" and jobs[0].kind == "fixed"
    argv = train_argv(finetuned, load_grid(path), str(tmp_path / "out"))
    assert f"--init_from={tmp_path}/out/g/dense__seed_2/ckpt.pt" in argv
    assert argv[-2:] == ["--seed=2", f"--out_dir={tmp_path}/out/g/finetuned__seed_2"]


@pytest.mark.parametrize("runs, extra, message", [
    ({"ft": {"init_from": "run:dens"}, "dense": {}}, "",
     "init_from='run:dens' names no run of the grid; did you mean dense"),
    ({"a": {"windw": 4}}, "", "run a: unknown config key 'windw'; did you mean window"),
    ({"a": {"window": "wide"}}, "", "run a: config key 'window' expects int"),
    ({"a": {"init_from": "run:b"}, "b": {"random_global_q": "matched:a"}}, "", "runs a -> b -> a form a cycle"),
    ({"a": {"schedule": "run:b"}, "b": {}}, "", "'run:NAME' is a value of init_from only"),
    ({"a": {"out_dir": "x"}}, "", "a sets out_dir, which the runner sets"),
    ({"a": {"dtype": "float32"}, "b": {}}, "", "run a sets dtype: every run of a grid trains with the same dtype"),
    ({"a": {}}, "refrences = {}", "unknown grid setting(s) refrences"),
    ({"a": {}}, "references = {'local': 'b'}", "references['local'] = 'b' is not a run"),
    ({"a": {"init_from": "run:b", "seeds": [3]}, "b": {}}, "", "needs b at seed 3"),
    ({"a": {}}, "comparisons = {'x': ('a', 'b')}", "comparisons['x'] = ('a', 'b'): 'b' is not a run"),
    ({"a": {}}, "comparisons = {'x': 'a'}", "comparisons must be a dict of question -> (run, other run)"),
    ({"a": {}}, "comparisons = {'x': ('a', 'a')}", "name two runs"),
])
def test_bad_grid_files_get_one_line_errors(tmp_path, runs, extra, message):
    path = write_grid(tmp_path / "bad.py", runs, extra=extra)
    with pytest.raises(GridError) as e:
        plan(load_grid(path), str(tmp_path / "out"))
    assert message in str(e.value) and "\n" not in str(e.value)
    with pytest.raises(SystemExit) as e:
        compare.main([path, "--dry_run"])
    assert str(e.value).startswith("grid error: ") and message in str(e.value) and "\n" not in str(e.value)


def test_matched_rates_come_from_the_learned_runs_evaluation_at_the_same_seed(tmp_path, capsys):
    path = write_grid(tmp_path / "g.py", {"random": {"schedule": "R", "routing": "random",
                                                     "random_global_q": "matched:routed"},
                                          "routed": {"schedule": "RL"}}, common={"n_layer": 4}, seeds=[1, 2])
    g, out = load_grid(path), str(tmp_path / "out")
    jobs = plan(g, out)
    assert [j.key for j in jobs][:2] == [("routed", 1), ("routed", 2)]
    random_2 = next(j for j in jobs if j.key == ("random", 2))
    assert train_argv(random_2, g, out) is None  # not evaluated yet: cannot launch
    assert compare.main([path, "--dry_run", f"--out={out}"]) == 0
    shown = capsys.readouterr().out
    assert "random seed 2 (after routed seed 2): will train" in shown
    assert "--random_global_q=<per-layer global fractions of routed seed 2, once evaluated>" in shown
    for seed, rates in ((1, [0.9, None, 0.8, None]), (2, [0.25, None, 0.0625, None])):
        os.makedirs(jobs[seed - 1].out_dir)
        with open(os.path.join(jobs[seed - 1].out_dir, "eval.json"), "w") as f:
            json.dump({"global_frac_per_layer": rates, "settings": jobs[0].eval_settings}, f)  # as the grid evaluates
    argv = train_argv(random_2, g, out)
    assert "--random_global_q=[0.25, 0.0, 0.0625, 0.0]" in argv and "--routing=random" in argv
    # trained at those rates; then routed seed 2 is retrained and evaluated again
    os.makedirs(random_2.out_dir)
    open(os.path.join(random_2.out_dir, "ckpt.pt"), "w").close()
    with open(os.path.join(random_2.out_dir, "launches.json"), "w") as f:
        json.dump([{"step": "train", "argv": argv, "cwd": os.getcwd(), "wall_s": 1.0, "returncode": 0}], f)
    for rates, stale in (([0.252, None, 0.0625, None], False), ([0.25, None, 0.2, None], True)):
        with open(os.path.join(jobs[1].out_dir, "eval.json"), "w") as f:
            json.dump({"global_frac_per_layer": rates, "settings": jobs[0].eval_settings}, f)  # as the grid evaluates
        if stale:
            with pytest.raises(GridError, match=r"random__seed_2 trained at per-layer rates \[0.25, 0.0, 0.0625, "
                                                 r"0.0\], but routed seed 2's evaluation now gives \[0.25, 0.0, 0.2, "
                                                 r"0.0\]: delete that folder"):
                train_state(random_2, g, out)
        else:  # within the tolerance: the run stands (no summary yet: resume)
            assert train_state(random_2, g, out) == "resume"


def test_run_jobs_keeps_the_job_limit_and_the_order_and_blocks_what_depends_on_a_failure(tmp_path, monkeypatch):
    path = write_grid(tmp_path / "g.py", {"dense": {"schedule": "G"}, "ft": {"init_from": "run:dense"},
                                          "local": {"schedule": "L"}, "broken": {"schedule": "G"},
                                          "after_broken": {"init_from": "run:broken"}}, seeds=[1, 2])
    g = load_grid(path)
    jobs = plan(g, str(tmp_path / "out"))
    running, peak, finished, lock = set(), [0], [], threading.Lock()

    def fake_execute(job, *args):
        with lock:
            assert all(dep in finished for dep in job.deps)
            running.add(job.key)
            peak[0] = max(peak[0], len(running))
        time.sleep(0.02)
        with lock:
            running.discard(job.key)
            finished.append(job.key)
        return "failed: on purpose" if job.run == "broken" else "ok"

    monkeypatch.setattr(runner, "execute", fake_execute)
    status = runner.run_jobs(jobs, g, str(tmp_path / "out"), n_jobs=2, log=lambda line: None)
    assert peak[0] == 2 and len(finished) == 8
    assert status[("ft", 2)] == "ok" and status[("broken", 1)] == "failed: on purpose"
    assert status[("after_broken", 1)] == "blocked: broken seed 1 did not finish"


def test_every_process_of_a_job_gets_the_threads_asked_for(tmp_path, monkeypatch):
    """compare.py shares the cores among the jobs (threads_per_process); each process gets OMP_NUM_THREADS."""
    assert [runner.threads_per_process(jobs, cores=8) for jobs in (1, 2, 3, 8, 16)] == [8, 4, 2, 1, 1]
    path = write_grid(tmp_path / "g.py", {"dense": {"schedule": "G"}}, seeds=[1])
    g = load_grid(path)
    job = plan(g, str(tmp_path / "out"))[0]
    seen = []

    class FakeProcess:
        pid = 12345

        def __init__(self, argv, env, **kwargs):
            seen.append(env["OMP_NUM_THREADS"])

        def wait(self):
            return 0

    monkeypatch.setattr(runner.subprocess, "Popen", FakeProcess)
    assert runner.launch(job, "train", ["python", "train.py"], "train.log", threads=3) == 0
    assert seen == ["3"]


def result(seed, loss, **values):
    return {"seed": seed, "complete": loss is not None, "status": "ok" if loss is not None else "failed: x",
            "val_loss": loss, "global_frac": None, "flops_ideal": 0.5, "flops_computed": 0.5, "kv_bytes": 1024,
            "kv_bytes_dense": 2048, "tokens_per_s": 1000.0, "wall_s": 60.0, "sweep": [], "per_head": None,
            "val_history": [], **values}


def test_table_arithmetic_mean_range_ties_and_gap_recovery():
    assert spread([2.0, 2.2, None, float("nan")]) == pytest.approx((2.1, 2.0, 2.2))
    assert spread([None]) is None
    assert gap_recovery(2.1, local=2.2, dense=2.0) == pytest.approx(0.5)
    assert gap_recovery(1.9, local=2.2, dense=2.0) == pytest.approx(1.5)
    assert gap_recovery(2.1, local=2.0, dense=2.2) is None  # local beats dense: no gap to recover
    rows = [Row("local", "fixed", "LL", [1, 2], [result(1, 2.30), result(2, 2.26)]),
            Row("dense", "fixed", "GG", [1, 2], [result(1, 2.10), result(2, 2.12)]),
            Row("LG", "fixed", "LG", [1, 2], [result(1, 2.15), result(2, 2.13)]),
            Row("routed", "routed", "RR", [1, 2], [result(1, 2.16, global_frac=0.2), result(2, 2.18, global_frac=0.1)]),
            Row("broken", "routed", "RR", [1, 2], [result(1, 2.40), result(2, None)]),
            Row("lost", "routed", "RR", [1], [result(1, None)])]
    table = results_table(rows, {"local": "local", "dense": "dense"})
    lines = table_cells(table)
    # local 2.28, dense 2.11: routed 2.17 recovers (2.28 - 2.17) / (2.28 - 2.11) = 65%
    assert lines["routed"][3] == "2.170 [2.160-2.180]" and lines["routed"][4] == "15.0%"
    assert lines["routed"][10] == "65%" and lines["local"][10] == "0%" and lines["dense"][10] == "100%"
    assert lines["LG"][10] == "82%"  # (2.28 - 2.14) / 0.17
    # best fixed is dense (2.11); LG is behind it by 0.05 and 0.01, routed by 0.06 at both seeds
    assert lines["dense"][11] == "best fixed" and lines["LG"][11] == "+0.030 [+0.010, +0.050] worse on every seed"
    assert lines["routed"][11] == "+0.060 [+0.060, +0.060] worse on every seed"
    assert lines["broken"][10] == "-50%"  # seed 1 only: (2.30 - 2.40) / (2.30 - 2.10)
    assert lines["broken"][2] == "1 of 2 (seed 2 failed: x)" and lines["broken"][3] == "2.400"
    assert lines["lost"][3] == "missing" and lines["lost"][10] == "missing"
    assert lines["local"][7] == "1.0 KiB (50%)" and lines["local"][4] == "-"
    assert "**Incomplete**: broken, lost" in table
    # same seed: routed - local = -0.14, -0.08 (better on both); LG - dense = +0.05, +0.01 (worse on both)
    assert lines["routed"][12] == "-0.110 [-0.140, -0.080] better on every seed"
    assert lines["LG"][13] == "+0.030 [+0.010, +0.050] worse on every seed" and lines["local"][12] == "reference"
    assert lines["broken"][12] == "+0.100 (1 seed)" and lines["lost"][12] == "missing"
    tied = [Row("local", "fixed", "L", [1, 2], [result(1, 2.0), result(2, 2.2)]),
            Row("dense", "fixed", "G", [1, 2], [result(1, 2.3), result(2, 2.3)]),
            Row("R1", "routed", "R", [1, 2], [result(1, 1.9), result(2, 1.9)]),
            Row("R2", "routed", "R", [1, 2], [result(1, 2.05), result(2, 2.05)]),
            Row("R3", "routed", "R", [1], [result(1, 2.5)])]
    table = results_table(tied, {"local": "local", "dense": "dense"})
    lines = table_cells(table)
    assert "| vs local and dense |" in table  # local (2.1) beats dense (2.3): no gap to recover
    assert lines["R1"][10] == "beats both" and lines["R2"][10] == "ties the better reference"
    assert lines["R3"][10] == "does not beat both (1 seed)" and lines["local"][10] == lines["dense"][10] == "reference"
    assert lines["local"][11] == "best fixed" and lines["R1"][11] == "-0.200 [-0.300, -0.100] better on every seed"
    assert lines["R2"][12] == "-0.050 [-0.150, +0.050] tie"  # one seed each way
    assert lines["R1"][12].endswith("better on every seed")


def test_rows_are_compared_at_equal_seeds_when_some_ran_a_third():
    """Seed 3 is a worse draw for every row: ranked by their means, the rows without it would look better."""
    rows = [Row("local", "fixed", "L", [1, 2, 3], [result(1, 2.00), result(2, 2.00), result(3, 2.50)]),
            Row("dense", "fixed", "G", [1, 2, 3], [result(1, 2.10), result(2, 2.10), result(3, 2.60)]),
            Row("LG", "fixed", "LG", [1, 2], [result(1, 1.99), result(2, 1.99)]),
            Row("LLLG", "fixed", "LLLG", [1, 2, 3], [result(1, 1.98), result(2, 1.98), result(3, 2.48)]),
            Row("routed", "routed", "R", [1, 2], [result(1, 1.97), result(2, 1.96)])]
    references = {"local": "local", "dense": "dense"}
    assert best_fixed(rows, references).run == "LLLG"  # by the means (2.147 vs LG's 1.990) it would be LG
    assert best_fixed(rows, {}).run == "LG"             # no local reference: the means are all there is
    lines = table_cells(results_table(rows, references))
    assert lines["LG"][11] == "+0.010 [+0.010, +0.010] worse on every seed"
    assert lines["routed"][11] == "-0.015 [-0.020, -0.010] better on every seed"
    assert lines["routed"][10] == "beats both" and lines["LLLG"][10] == "beats both"
    assert "rows ran different numbers of seeds" in results_table(rows, references)
    assert tables.paired_verdict([0.0004, 0.003]) == "tie"  # prints as +0.000 at seed 1: no difference there
    assert tables.paired_verdict([0.0006, 0.003]) == "worse" and tables.paired_verdict([-0.001, -0.002]) == "better"
    # at the boundary: a difference of exactly SMALLEST_DIFFERENCE (0.0005, +0.001 at 3 digits) counts
    assert tables.paired_verdict([-0.0005, -0.002]) == "better" and tables.paired_verdict([0.0005, 0.002]) == "worse"


def test_the_comparisons_table_gives_each_question_its_same_seed_difference(tmp_path):
    rows = [Row("local", "fixed", "L", [1, 2], [result(1, 2.00), result(2, 2.10)]),
            Row("routed", "routed", "R", [1, 2], [result(1, 1.98), result(2, 2.07)]),
            Row("random", "random", "R", [1], [result(1, 2.05)])]
    comparisons = {"learned vs local": ("routed", "local"), "learned vs random": ("routed", "random"),
                   "learned vs dense": ("routed", "dense")}
    lines = table_cells(tables.comparisons_table(rows, comparisons))
    assert lines["learned vs local"][1:] == ["routed - local", "-0.025 [-0.030, -0.020] better on every seed"]
    assert lines["learned vs random"][2] == "-0.070 (1 seed)" and lines["learned vs dense"][2] == "missing"
    assert tables.comparisons_table(rows, {}) == ""
    path = write_grid(tmp_path / "g.py", {"routed": {}, "local": {}}, extra="comparisons = {'q': ['routed', 'local']}")
    assert load_grid(path).comparisons == {"q": ("routed", "local")}


def test_plots_are_small_pngs_drawn_from_the_rows(tmp_path):
    sweep = [{"threshold": t, "val_loss": 2.0 + t, "global_frac": 1 - t, "attention_flop_frac_ideal": 1 - t,
              "attention_flop_frac_computed": 1.0} for t in (0.1, 0.5, 0.9)]
    per_head = [[0.5, 0.25], None, [0.0, 1.0]]
    routed = Row("routed", "routed", "RLR", [1, 2], [result(s, 2.1 + 0.01 * s, sweep=sweep, per_head=per_head,
                                                          global_frac=0.3, val_history=[[0, 5.5], [10, 3.0], [20, 2.5]])
                                                   for s in (1, 2)])
    wide = Row("routed_w64", "routed", "RLR", [1], [result(1, 2.05, global_frac=0.2)])
    rows = [Row("local", "fixed", "LLL", [1], [result(1, 2.3)]), routed, wide,
            Row("lost", "fixed", "G", [1], [result(1, None)])]
    references = {"local": "local", "dense": "dense"}
    rows.append(Row("dense", "fixed", "GGG", [1, 2], [result(1, 2.4), result(2, 2.1)]))
    rows.append(Row("half", "fixed", "GGG", [1], [result(1, 3.5)]))  # far above the references: off the plot
    ax = plots.pareto(tmp_path / "pareto.png", rows, references).axes[0]
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["half (+1.200, off the plot)", "local", "routed",
                                                                  "routed_w64", "dense"]  # lost has no loss
    assert ax.get_ylim()[1] == pytest.approx(0.45) and ax.get_ylabel() == "val loss minus local's, same seed"
    assert [c.get_label() for c in ax.containers] == ["local", "routed", "routed_w64", "dense"]
    assert [c.lines[0].get_xydata()[0].tolist() for c in ax.containers] == [pytest.approx([0.5, y])
                                                                          for y in (0.0, -0.19, -0.25, 0.1)]
    # routed's sweep at the seed it shares with local, shifted as its trained point: loss - 2.3
    (sweep_line,) = [line for line in ax.lines if line.get_linewidth() == 0.7]
    assert sweep_line.get_xydata().ravel().tolist() == pytest.approx([0.1, 0.6, 0.5, 0.2, 0.9, -0.2])
    # losses minus local's at the same seed (local ran seed 1 only): dense +0.1, routed -0.19, wide -0.25
    losses, label = plots._losses(rows, references)
    assert label == "val loss minus local's, same seed" and losses["lost"] == (None, {})
    assert losses["routed"][1] == pytest.approx({1: -0.19}) and losses["dense"][0] == pytest.approx((0.1, 0.1, 0.1))
    # the loss axis ends the span (best -0.25 .. dense +0.1) above the worse reference
    assert plots._loss_ceiling(losses, references) == pytest.approx(0.1 + 0.35)
    raw, label = plots._losses(rows, {})
    assert label == "val loss" and raw["routed"][0] == pytest.approx((2.115, 2.11, 2.12))
    assert plots._loss_ceiling(raw, {}) is None
    assert plots.window(tmp_path / "ladder.png", [[(32, rows[0]), (64, rows[0])]]) is None  # no routed row: no plot
    assert not (tmp_path / "ladder.png").exists()
    ax = plots.window(tmp_path / "window.png", [[(32, routed), (64, wide)]]).axes[0]
    assert ax.get_xscale() == "log" and [t.get_text() for t in ax.get_xticklabels()] == ["32", "64"]
    (group,) = ax.containers
    assert group.get_label() == "routed / routed_w64" and group.lines[0].get_xydata().tolist() == [[32, 0.3], [64, 0.2]]
    ax = plots.heatmap(tmp_path / "heatmap.png", "routed seed 1", per_head, "RLR").axes[0]
    assert [t.get_text() for t in ax.texts] == ["50%", "25%", "0%", "100%"]  # the local layer's row is blank
    assert [t.get_text() for t in ax.get_yticklabels()] == ["0 R", "1 L", "2 R"]
    assert ax.images[0].get_array().tolist() == [[0.5, 0.25], [None, None], [0.0, 1.0]]
    ax = plots.val_curves(tmp_path / "curves.png", [(row.run, row.results[0]["val_history"]) for row in rows]).axes[0]
    (curve,) = ax.lines  # the rows without a history draw none; step 0 is left out
    assert curve.get_label() == "routed" and curve.get_xydata().tolist() == [[10, 3.0], [20, 2.5]]
    for name in ("pareto.png", "window.png", "heatmap.png", "curves.png"):
        data = (tmp_path / name).read_bytes()
        assert data.startswith(b"\x89PNG") and 5_000 < len(data) < 150_000


def test_a_summary_puts_records_side_by_side_from_their_rows_json(tmp_path, capsys, monkeypatch):
    """rows.json holds what a record's table and plots need; --summary reads two records back into one table
    (a column group per record) and one plot."""
    def rows(shift):
        return [Row("local", "fixed", "LL", [1, 2], [result(1, 2.30 + shift), result(2, 2.26 + shift)]),
                Row("dense", "fixed", "GG", [1, 2], [result(1, 2.10 + shift), result(2, 2.12 + shift)]),
                Row("routed", "routed", "RR", [1, 2], [result(s, 2.16 + shift, global_frac=0.1 * s) for s in (1, 2)])]
    records = []
    for name, shift in (("bytes", 0.0), ("bpe", 1.0)):
        records.append(str(tmp_path / f"2026-01-01_{name}"))
        os.makedirs(records[-1])
        asked = {"learned vs local": ("routed", "local")} if name == "bytes" else {}
        g = Grid(name, "", "", [], {}, [1, 2], {}, {}, {"local": "local", "dense": "dense"}, {}, asked)
        tables.save_rows(os.path.join(records[-1], "rows.json"), g, rows(shift))
    name, references, loaded, comparisons = tables.load_rows(records[1])
    assert name == "bpe" and references == {"local": "local", "dense": "dense"} and loaded == rows(1.0)
    assert comparisons == {} and tables.load_rows(records[0])[3] == {"learned vs local": ("routed", "local")}
    out = str(tmp_path / "results")
    drawn, draw = [], plots.pareto_panels
    monkeypatch.setattr(plots, "pareto_panels", lambda *args: drawn.append(draw(*args)))
    assert compare.main(["--summary=both", *records, f"--record_dir={out}"]) == 0
    (folder,) = os.listdir(out)
    assert folder.endswith("_both") and set(os.listdir(os.path.join(out, folder))) == {"README.md", "table.md",
                                                                                        "pareto.png"}
    table = open(os.path.join(out, folder, "table.md")).read()
    line = table_cells(table)["routed"]
    # best fixed: dense 2.10, 2.12; local 2.30, 2.26 at seeds 1, 2
    worse = "+0.050 [+0.040, +0.060] worse on every seed"
    assert line[:2] == ["routed", "RR"] and line[2:7] == ["2.160", "15.0%", "50%", worse,
                                                          "-0.120 [-0.140, -0.100] better on every seed"]
    assert line[7:11] == ["3.160", "15.0%", "50%", worse] and "| bpe: val loss |" in table
    assert table_cells(table)["dense"][5] == "best fixed"
    # the comparisons: bytes asks one question, bpe none, and bpe answers it too (it has both runs)
    better = "-0.120 [-0.140, -0.100] better on every seed"
    assert table_cells(table)["learned vs local"][1:] == ["routed - local", better, better]
    png = open(os.path.join(out, folder, "pareto.png"), "rb").read()
    assert png.startswith(b"\x89PNG") and 5_000 < len(png) < 200_000
    (fig,) = drawn  # one panel per record, one legend for both
    assert [ax.get_title() for ax in fig.axes] == ["bytes", "bpe"]
    assert [t.get_text() for t in fig.legends[0].get_texts()] == ["local", "dense", "routed"]
    for ax in fig.axes:  # the same same-seed differences in both: bpe is bytes shifted by 1.0
        assert [c.lines[0].get_ydata()[0] for c in ax.containers] == pytest.approx([0.0, -0.17, -0.12])
    with pytest.raises(SystemExit, match="rows.json not found"):
        compare.main(["--summary=again", str(tmp_path), f"--record_dir={out}"])


def test_val_curves_of_a_fine_tuned_run_start_after_the_run_it_starts_from():
    from types import SimpleNamespace as NS
    jobs = [NS(run="dense_half", out_dir="out/g/dense_half__seed_1", tcfg=NS(init_from="scratch", max_iters=50)),
            NS(run="finetuned", out_dir="out/g/finetuned__seed_1",
               tcfg=NS(init_from="out/g/dense_half__seed_1/ckpt.pt", max_iters=50))]
    rows = [Row("dense_half", "fixed", "G", [1], [result(1, 2.5, val_history=[[0, 5.0], [50, 2.5]])]),
            Row("finetuned", "routed", "R", [1], [result(1, 2.2, val_history=[[0, 2.5], [25, 2.3], [50, 2.2]])])]
    assert compare.val_curves(jobs, rows) == [("dense_half, seed 1", [[0, 5.0], [50, 2.5]]),
                                              ("finetuned (after dense_half), seed 1",
                                               [[50, 2.5], [75, 2.3], [100, 2.2]])]
    # key-token curves: [step, key loss, other loss] entries, the same offset; rows without any draw nothing
    rows[1].results[0]["key_history"] = [[0, None, 2.5], [25, 2.0, 2.4]]
    assert compare.val_curves(jobs, rows, "key_history") == [("dense_half, seed 1", []),
                                                             ("finetuned (after dense_half), seed 1",
                                                              [[50, None], [75, 2.0]])]
    # copy gain: from the first seed that has it (seed 1 trained before the probe), named
    rows[1].results.append(result(2, 2.1, copy_history=[[0, 0.0, [0.0]], [50, 0.3, [0.1]]]))
    assert compare.val_curves(jobs, rows, "copy_history") == [("dense_half, seed 1", []),
                                                              ("finetuned (after dense_half), seed 2",
                                                               [[50, 0.0], [100, 0.3]])]


def test_the_committed_grids_plan(tmp_path):
    names = [n for n in os.listdir(os.path.join(ROOT, "configs", "grids")) if n.endswith(".py") and n[0] != "_"]
    assert len(names) >= 3
    for name in sorted(names):
        g = load_grid(os.path.join(ROOT, "configs", "grids", name))
        jobs = plan(g, str(tmp_path))
        assert g.doc and [j.run for j in jobs if j.seed == g.run_seeds[j.run][0]] == run_order(g)
        if name in ("stdlib_bytes.py", "stdlib_bpe.py"):  # the comparison grids: references, seeds, windows
            assert {"local", "dense"} <= set(g.references.values())
            assert all(len(g.run_seeds[r]) >= 2 for r in g.runs)
            assert window_groups(jobs)  # the window sweep


def two_rows():
    from nanoaha.grid.tables import Row
    return [Row("local", "fixed", "L", [1, 2], [result(1, 2.000), result(2, 2.000)]),
            Row("routed", "routed", "R", [1, 2], [result(1, 1.999, global_frac=0.1), result(2, 1.998)])]



def test_the_table_notes_state_the_smallest_difference_the_verdicts_use(monkeypatch):
    from nanoaha.grid import tables
    references = {"local": "local"}
    assert "by 0.0005 or more (prints as 0.001 or more)" in tables.results_table(two_rows(), references)
    monkeypatch.setattr(tables, "SMALLEST_DIFFERENCE", 0.0015)  # routed's -0.001 and -0.002 now include a tie
    table = tables.results_table(two_rows(), references)
    assert "by 0.0015 or more (prints as 0.002 or more)" in table and "] tie |" in table
    summary = tables.summary_table([("g", two_rows(), references)])
    assert "by 0.0015 or more, else a tie" in summary



RECORDS = ["results/2026-12-02_stdlib_bytes", "results/2026-12-02_stdlib_bpe"]  # the README's summary reads these



@pytest.mark.parametrize("record", RECORDS)
def test_a_committed_records_table_regenerates_from_its_rows_json_byte_for_byte(record):
    """A record's table.md is drawn from its rows.json alone. When a change to the tables is meant, this says
    which committed records' tables it changes (records are written once: they keep the old table)."""
    from nanoaha.grid.tables import load_rows, record_table
    root = ROOT
    _, references, rows, comparisons = load_rows(os.path.join(root, record))
    with open(os.path.join(root, record, "table.md")) as f:
        assert record_table(rows, references, comparisons) == f.read()



def test_the_readmes_summary_of_the_committed_records_regenerates_byte_for_byte():
    """2026-12-02_stdlib_bpe was written before grids had comparisons: the summary still reads it."""
    from nanoaha.grid.tables import load_rows, summary_record_table
    root = ROOT
    grids = [load_rows(os.path.join(root, record)) for record in RECORDS]
    assert [len(comparisons) > 0 for *_, comparisons in grids] == [True, False]
    with open(os.path.join(root, "results", "2026-12-02_stdlib_grids", "table.md")) as f:
        assert summary_record_table([(name, rows, refs, comps) for name, refs, rows, comps in grids]) == f.read()



@pytest.mark.parametrize("argv, message", [
    (["configs/grids/tiny.py", "--jobs=two"], "config error: config key 'jobs' expects int, got the string 'two'"),
    (["configs/grids/tiny.py", "--jobs=-1"], "--jobs=-1 --threads=0: use a positive number, or 0 for the default"),
    (["configs/grids/tiny.py", "--threads=-2"], "--jobs=0 --threads=-2: use a positive number"),
    (["configs/grids/tiny.py", "configs/grids/stdlib_bpe.py"], "name one grid file: python compare.py"),
    (["--summary=s"], "--summary=NAME: name the record folders to put side by side"),
    (["configs/grids/tiny.py", "--dry_run", "--jobs"], "config error: override '--jobs' must look like --jobs=VALUE"),
])
def test_compare_refuses_a_bad_command_line_with_one_line(argv, message):
    import compare
    with pytest.raises(SystemExit) as e:
        compare.main(argv)
    assert str(e.value).startswith(message) and "\n" not in str(e.value)



def test_more_threads_than_cores_get_one_warning_line(tmp_path, capsys, monkeypatch):
    """--jobs=999 --threads=999 on 2 cores passed without a word."""
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    path = write_grid(tmp_path / "g.py", {"local": {"schedule": "L"}}, {"max_iters": 5})
    assert compare.main([path, "--dry_run", "--jobs=999", "--threads=999", f"--out={tmp_path / 'out'}"]) == 0
    [line] = capsys.readouterr().err.splitlines()
    assert line.startswith("WARNING: --jobs=999 x --threads=999 = 998001 threads on 2 CPU cores") and \
        line.endswith("use jobs x threads <= 2")
    for argv in (["--jobs=2", "--threads=1"], ["--jobs=1", "--threads=2"], []):  # the default: one per core
        compare.main([path, "--dry_run", *argv, f"--out={tmp_path / 'out'}"])
        assert capsys.readouterr().err == ""


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_stopped_grid_exits_with_128_plus_its_signal(tmp_path, monkeypatch, capsys, signum):
    """compare.py exited 130 on SIGTERM too; 143 is what a shell and a scheduler expect of it."""
    monkeypatch.setattr(runner, "stop_requested", threading.Event())
    monkeypatch.setattr(compare, "stopped_by", None)
    monkeypatch.setattr(runner, "run_jobs", lambda *args, **kwargs: (compare.stop_grid(signum, None), {})[1])
    grid = load_grid(write_grid(tmp_path / "g.py", {"local": {"schedule": "L"}}, {"max_iters": 5}))
    cfg = compare.CompareConfig(jobs=1, threads=1, out=str(tmp_path / "out"))
    assert compare.run_grid(grid, [], cfg, []) == 128 + signum
    assert "run the same command again to resume" in capsys.readouterr().err


def test_key_token_columns_appear_with_key_losses_and_compare_at_the_same_seed():
    """Rows whose evaluations have key-token losses get a key-token loss column and same-seed differences on it
    (table and comparisons); the val-loss columns are unchanged."""
    from nanoaha.grid.tables import comparisons_table
    rows = [Row("local", "fixed", "L", [1, 2], [result(1, 2.00, key_loss=1.50, key_frac=0.18),
                                                result(2, 2.02, key_loss=1.54, key_frac=0.19)]),
            Row("dense", "fixed", "G", [1, 2], [result(1, 2.05, key_loss=1.40, key_frac=0.18),
                                                result(2, 2.06, key_loss=1.46, key_frac=0.19)])]
    table = results_table(rows, {"local": "local", "dense": "dense"})
    header, _, local_line, dense_line = table.splitlines()[:4]
    columns = [c.strip() for c in header.strip("|").split("|")]
    assert columns[3:5] == ["val loss mean [min-max]", "key-token loss mean [min-max]"]
    assert columns[-2:] == ["key-token loss vs local, same seed", "key-token loss vs dense, same seed"]
    dense_cells = [c.strip() for c in dense_line.strip("|").split("|")]
    assert len(dense_cells) == len(columns) and dense_cells[4] == "1.430 [1.400-1.460]"
    # dense - local: val +0.05/+0.04 (worse), key tokens -0.10/-0.08 (better), at the same seeds
    assert dense_cells[columns.index("vs local, same seed")] == "+0.045 [+0.040, +0.050] worse on every seed"
    assert dense_cells[-2] == "-0.090 [-0.100, -0.080] better on every seed"
    assert "18.0%-19.0% of the scored targets here" in table
    comparisons = comparisons_table(rows, {"dense vs local": ("dense", "local")})
    assert comparisons.splitlines()[0].endswith("| key-token loss difference, same seed |")
    assert comparisons.splitlines()[2].endswith("| -0.090 [-0.100, -0.080] better on every seed |")
    without = [Row(r.run, r.kind, r.layers, r.seeds, [{**x, "key_loss": None} for x in r.results]) for r in rows]
    assert "key-token" not in results_table(without, {"local": "local", "dense": "dense"}).splitlines()[0]


def test_a_grid_of_more_than_20_runs_gets_a_colour_per_run(tmp_path):
    rows = [Row(f"local_{i}", "fixed", "L", [1], [result(1, 2.0 + 0.01 * i)]) for i in range(25)]
    ax = plots.pareto(tmp_path / "pareto.png", rows).axes[0]
    colours = [tuple(c.lines[0].get_color()) for c in ax.containers]
    assert len(colours) == 25 and len(set(colours)) == 25


def test_the_key_token_pareto_plots_key_losses_at_the_same_seed(tmp_path):
    """pareto(metric='key_loss'): key-token loss minus local's at the same seed, sweep lines from the sweep
    rows' key_loss, shifted as the trained point."""
    sweep = [{"threshold": t, "val_loss": 2.0, "key_loss": 1.3 + t, "global_frac": 1 - t,
              "attention_flop_frac_ideal": 1 - t, "attention_flop_frac_computed": 1.0} for t in (0.1, 0.9)]
    rows = [Row("local", "fixed", "L", [1], [result(1, 2.30, key_loss=1.50, flops_ideal=0.05)]),
            Row("dense", "fixed", "G", [1], [result(1, 2.40, key_loss=1.35, flops_ideal=1.0)]),
            Row("routed", "routed", "R", [1], [result(1, 2.25, key_loss=1.42, flops_ideal=0.3, sweep=sweep)])]
    fig = plots.pareto(tmp_path / "pareto_key.png", rows, {"local": "local", "dense": "dense"}, metric="key_loss")
    ax = fig.axes[0]
    assert ax.get_ylabel() == "key-token loss minus local's, same seed" and "key-token loss" in ax.get_title()
    points = {c.get_label(): c.lines[0].get_xydata()[0].tolist() for c in ax.containers}
    assert points == {"local": pytest.approx([0.05, 0.0]), "dense": pytest.approx([1.0, -0.15]),
                      "routed": pytest.approx([0.3, -0.08])}
    (line,) = [line for line in ax.lines if line.get_linewidth() == 0.7]
    # the sweep's key losses 1.4 and 2.2 shifted by the trained point's offset (-0.08 - 1.42)
    assert line.get_xydata().tolist() == [pytest.approx([0.1, 2.2 - 1.5]), pytest.approx([0.9, 1.4 - 1.5])]


def test_the_summary_gives_key_token_columns_to_grids_evaluated_with_key_tokens():
    """A grid whose evaluations have key-token losses gets two more columns in the summary (its key-token loss
    and the same-seed difference to local); a grid without them keeps its five."""
    from nanoaha.grid.tables import summary_table
    old = [Row("local", "fixed", "L", [1], [result(1, 2.30)]), Row("routed", "routed", "R", [1], [result(1, 2.25)])]
    new = [Row("local", "fixed", "L", [1], [result(1, 2.30, key_loss=1.50)]),
           Row("routed", "routed", "R", [1], [result(1, 2.25, key_loss=1.42)])]
    refs = {"local": "local"}
    table = summary_table([("old", old, refs), ("new", new, refs)])
    header = [c.strip() for c in table.splitlines()[0].strip("|").split("|")]
    assert header[-2:] == ["new: key-token loss", "new: key-token loss vs local, same seed"]
    assert not any(c.startswith("old: key") for c in header) and len(header) == 2 + 5 + 7
    cells = table_cells(table)["routed"]
    assert cells[-2:] == ["1.420", "-0.080 (1 seed)"]
    assert "Key-token loss:" in table and "Key-token loss:" not in summary_table([("old", old, refs)])


def test_comparisons_along_training_find_where_a_run_stays_ahead_at_every_seed(tmp_path):
    """Same-seed differences at the steps both runs evaluated; the step from which the difference stays below
    zero on every seed (a dip that comes back does not count); the table and the plot from them."""
    from nanoaha.grid.tables import below_zero_from, comparison_curves_table, history_differences
    from nanoaha.grid import plots

    def run(seed, losses, keys):
        return result(seed, losses[-1], key_loss=keys[-1],
                      val_history=[[s, l] for s, l in zip((0, 100, 200, 300, 400), losses)],
                      key_history=[[s, k, None] for s, k in zip((0, 100, 200, 300, 400), keys)])
    local = Row("local", "fixed", "L", [1, 2], [run(1, [5, 2.0, 1.8, 1.7, 1.6], [5, 1.5, 1.4, 1.3, 1.2]),
                                                run(2, [5, 2.0, 1.8, 1.7, 1.6], [5, 1.5, 1.4, 1.3, 1.2])])
    # all tokens: seed 1 below from 200, seed 2 dips below at 100, back above at 200, below from 300
    dense = Row("dense", "fixed", "G", [1, 2], [run(1, [5, 2.1, 1.7, 1.6, 1.5], [5, 1.6, 1.3, 1.2, 1.1]),
                                                run(2, [5, 1.9, 1.9, 1.6, 1.55], [5, 1.6, 1.5, 1.4, 1.3])])
    diffs = history_differences(dense, local)
    assert sorted(diffs) == [1, 2] and [s for s, _ in diffs[1]] == [100, 200, 300, 400]  # step 0 left out
    assert diffs[2][0][1] == pytest.approx(-0.1)
    assert below_zero_from(diffs) == 300
    assert below_zero_from(history_differences(dense, local, "key_loss")) is None  # seed 2 stays above
    table = comparison_curves_table([local, dense], {"dense vs local": ("dense", "local")}, tokens_per_step=4096)
    cells = [c.strip() for c in table.splitlines()[2].strip("|").split("|")]
    assert cells == ["dense vs local", "dense - local", "step 300 (1.2M tokens)", "-0.075 at step 400 (2 seeds)",
                     "not at the last evaluation", "+0.000 at step 400 (2 seeds)"]
    no_history = [Row(r.run, r.kind, r.layers, r.seeds, [{**x, "val_history": [], "key_history": []}
                                                         for x in r.results]) for r in (local, dense)]
    assert comparison_curves_table(no_history, {"dense vs local": ("dense", "local")}, 4096) == ""
    fig = plots.comparison_curves(tmp_path / "c.png", [("all tokens", [("dense - local", diffs)])])
    (ax,) = fig.axes
    assert len(ax.lines) == 3 and list(ax.lines[1].get_xdata()) == [100, 200, 300, 400]  # 2 seeds + the zero line
    assert (tmp_path / "c.png").stat().st_size > 1000
    # one legend entry per comparison and per seed (not per pair of them), inside the saved image
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["dense - local", "seed 1", "seed 2"]
    import matplotlib.image
    width = matplotlib.image.imread(tmp_path / "c.png").shape[1]
    legend_right = ax.get_legend().get_window_extent().x1 - fig.get_tightbbox().x0 * fig.dpi
    assert width >= legend_right > fig.get_figwidth() * fig.dpi * 0.9  # the legend beside the axes, not cut off
    # evaluations over more than a decade: a log step axis labelled at 1-2-5 steps in plain numbers
    wide = {1: [[s, -0.01] for s in (250, 500, 1000, 2000, 4000, 7325)]}
    (ax,) = plots.comparison_curves(tmp_path / "w.png", [("all tokens", [("dense - local", wide)])]).axes
    assert ax.get_xscale() == "log"
    assert [t.get_text() for t in ax.get_xticklabels()] == ["500", "1,000", "2,000", "5,000"]
    assert ax.xaxis.get_minor_locator().tick_values(250, 7325) == []


def test_the_per_layer_table_says_where_routing_spends_global_attention_and_what_it_buys():
    """From each seed's evaluation: the layer's global fraction, key-token recall and precision (head 'any'),
    and its forced-local losses minus the trained ones; means over the seeds."""
    from nanoaha.grid.tables import per_layer_routing, per_layer_table
    evaluation = {"val_loss": 2.0, "key_loss": 1.5,
                  "forced_routing": {"global": {"val_loss": 2.1, "key_loss": 1.4, "other_loss": 2.2},
                                     "local_layer0": {"val_loss": 2.01, "key_loss": 1.52, "other_loss": 2.1},
                                     "local_layer1": {"val_loss": 2.0, "key_loss": 1.5, "other_loss": 2.1}},
                  "key_routing": [{"layer": 0, "head": "any", "global_frac": 0.4, "precision": 0.3, "recall": 0.6},
                                  {"layer": 0, "head": 0, "global_frac": 0.2, "precision": 0.1, "recall": 0.1},
                                  {"layer": 1, "head": "any", "global_frac": 0.1, "precision": 0.2, "recall": 0.2}],
                  "global_frac_per_layer": [0.25, None]}  # the head decisions' fraction; None: not measured
    layers = per_layer_routing(evaluation)
    assert [(x["layer"], x["global_frac"], x["key_recall"]) for x in layers] == [(0, 0.4, 0.6), (1, 0.1, 0.2)]
    assert layers[0]["decisions_global_frac"] == pytest.approx(0.25) and layers[1]["decisions_global_frac"] is None
    assert layers[0]["forced_local_val"] == pytest.approx(0.01) and layers[0]["forced_local_key"] == pytest.approx(0.02)
    assert per_layer_routing({"val_loss": 2.0}) == []  # evaluations before per-layer forcing
    second = [{**layers[0], "global_frac": 0.2, "decisions_global_frac": 0.15, "forced_local_key": 0.04}, layers[1]]
    rows = [Row("routed", "routed", "RR", [1, 2], [result(1, 2.0, per_layer_routing=layers),
                                                   result(2, 2.0, per_layer_routing=second)]),
            Row("local", "fixed", "LL", [1, 2], [result(1, 2.0), result(2, 2.0)])]
    lines = per_layer_table(rows).splitlines()
    assert len(lines) == 4
    assert [c.strip() for c in lines[2].strip("|").split("|")] == ["routed", "0", "20.0% / 30.0%", "60.0% / 30.0%",
                                                                    "+0.010", "+0.030"]
    assert per_layer_table(rows[1:]) == ""


def test_the_copy_head_table_names_the_strongest_induction_head_and_the_previous_token_heads_below_it():
    """From the repeat probe's last entry per seed: the head of highest induction score, and in each layer below
    it the strongest previous-token head; a local row (no induction scores) and an unprobed run get none."""
    heads = {"previous": [[0.1, 0.6, 0.2, 0.0], [0.05, 0.3, 0.7, 0.1], [0.0, 0.1, 0.2, 0.3], [0.1, 0.1, 0.1, 0.1]],
             "induction": [[0.0] * 4, [0.0] * 4, [0.0] * 4, [0.01, 0.02, 0.12, 0.03]]}
    early = {"previous": heads["previous"], "induction": [[0.0] * 4, [0.0] * 4, [0.0] * 4, [0.5, 0.0, 0.0, 0.0]]}
    local = {"previous": heads["previous"], "induction": [[0.0] * 4] * 4}
    rows = [Row("LLLG", "fixed", "LLLG", [1, 2], [result(1, 2.0, copy_history=[[250, 0.0, [0.0], early],
                                                                                 [500, 0.2, [0.12], heads]]),
                                                   result(2, 2.0, copy_history=[[500, 0.05, [0.0]]])]),  # no scores
            Row("local", "fixed", "LLLL", [1], [result(1, 2.0, copy_history=[[500, 0.01, [0.0], local]])])]
    table = tables.copy_head_table(rows)
    assert len(table.splitlines()) == 4  # header, rule, one line per probed seed
    cells = table_cells(table)
    assert cells["LLLG"] == ["LLLG", "LLLG", "1", "+0.20 (a copy head)", "3.2: 0.12", "0.1: 0.60, 1.2: 0.70, 2.3: 0.30"]
    assert cells["local"] == ["local", "LLLL", "1", "+0.01", "-", "-"]
    assert tables.copy_head_table([]) == ""


@pytest.mark.parametrize("path", sorted(p for p in os.listdir(os.path.join(ROOT, "configs", "grids"))
                                        if p.endswith(".py") and not p.startswith("_")))  # _*: shared rows
def test_every_shipped_grid_file_loads_and_plans(path, tmp_path):
    """A grid file that a record or the docs name must still load against today's config keys and plan every
    run (train.py's flags, a run: reference that exists, the evaluation's settings)."""
    grid = load_grid(os.path.join(ROOT, "configs", "grids", path))
    jobs = plan(grid, str(tmp_path))
    assert jobs and {job.run for job in jobs} == set(grid.runs)
    for question, (run, other) in grid.comparisons.items():
        assert run in grid.runs and other in grid.runs, question


def test_a_runs_wall_time_is_train_pys_clock_over_its_processes_where_the_checkpoint_kept_it(tmp_path):
    """The runner's launches miss a process killed with the runner; train.py's train_wall_s (carried in the
    checkpoint) counts it. Summaries written before that field fall back to the launches."""
    job = plan(load_grid(write_grid(tmp_path / "g.py", {"local": {"schedule": "L"}})), str(tmp_path / "out"))[0]
    os.makedirs(job.out_dir)
    with open(os.path.join(job.out_dir, "launches.json"), "w") as f:
        json.dump([{"step": "train", "argv": [], "cwd": "", "wall_s": 100.0, "returncode": 0},
                   {"step": "evaluate", "argv": [], "cwd": "", "wall_s": 7.0, "returncode": 0}], f)
    for summary, wall in (({"wall_s": 90.0, "train_wall_s": 1300.0}, 1300.0), ({"wall_s": 90.0}, 100.0),
                          ({"wall_s": 90.0, "train_wall_s": None}, 100.0)):
        with open(os.path.join(job.out_dir, "train_summary.json"), "w") as f:
            json.dump(summary, f)
        assert tables.collect(job)["wall_s"] == wall


def test_a_kept_runs_command_is_compared_as_its_checkout_saw_it_so_a_record_grows_in_another_checkout():
    argv = ["python", "train.py", "configs/quickstart.py", "--schedule=L", "--data_dir=data/python_stdlib"]
    here, there = comparable(argv, "/work/one"), comparable(argv, "/work/two")
    assert here != there  # one checkout: a runner started elsewhere would read other files
    assert comparable(argv, "/work/one", relative=True) == comparable(argv, "/work/two", relative=True)
    moved = ["python", "train.py", "configs/other.py", "--schedule=L", "--data_dir=data/python_stdlib"]
    assert comparable(moved, "/work/two", relative=True) != comparable(argv, "/work/one", relative=True)


def test_a_copy_head_is_a_copy_gain_that_ends_at_the_level_and_is_dated_from_when_it_first_reached_it():
    from nanoaha.grid.tables import COPY_HEAD_GAIN, agreement_text, copy_head_step
    assert COPY_HEAD_GAIN == 0.1
    assert copy_head_step({"copy_history": [[0, 0.0], [250, 0.12], [500, 0.05], [750, 0.15]]}) == 250
    assert copy_head_step({"copy_history": [[0, 0.0], [250, 0.12], [500, 0.09]]}) is False  # lost again
    assert copy_head_step({"copy_history": []}) is None and copy_head_step({}) is None  # not probed
    assert agreement_text([-0.001, 0.002, 0.0001]) == "better on 1, worse on 1, tie on 1 of 3"
    assert agreement_text([0.0005, 0.2]) == "worse on 2 of 2"


def test_a_headline_with_a_noise_floor_counts_the_differences_inside_it_as_within_and_says_where_it_comes_from():
    """The floor is the largest same-seed difference between the reference and itself on another data order;
    a row's differences inside it (either sign) are counted as within, those outside as better or worse."""
    from nanoaha.grid.tables import agreement_text, headline_table, noise_floor
    assert agreement_text([-0.05, -0.01, 0.02, 0.03, 0.2], floor=0.03) == \
        "better on 1, worse on 1, within \u00b10.030 on 3 of 5"
    ref = Row("LG", "fixed", "LG", [1, 2, 3], [result(s, loss, key_loss=key) for s, loss, key in ((1, 2.0, 1.0), (2, 2.1, 1.1), (3, 2.2, 1.2))])
    again = Row("LG_again", "fixed", "LG", [1, 2, 3], [result(1, 2.01, key_loss=1.0), result(2, 2.08, key_loss=1.06),
                                                     result(3, 2.2, key_loss=1.2)])
    routed = Row("routed", "routed", "RR", [1, 2, 3], [result(1, 1.95, key_loss=1.0), result(2, 2.115, key_loss=1.05),
                                                     result(3, 2.3, key_loss=1.3)])
    floor, diffs = noise_floor(again, ref)
    assert floor == pytest.approx(0.02) and diffs == pytest.approx([0.01, -0.02, 0.0])
    assert noise_floor(again, ref, "key_loss")[0] == pytest.approx(0.04)
    lines = headline_table([ref, again, routed], {"LG": "x", "routed": "y"}, "LG", floor_run="LG_again").splitlines()
    cells = [c.strip() for c in lines[3].strip("|").split("|")]
    assert cells[5] == "+0.022 [-0.050, +0.100], better on 1, worse on 1, within \u00b10.020 on 1 of 3"
    assert cells[6] == "+0.017 [-0.050, +0.100], better on 1, worse on 1, within \u00b10.040 on 1 of 3"  # key tokens' own floor
    assert lines[-1].startswith("Noise floor: `LG_again` (LG on another data order, same init) against LG at the "
                                "same seed: +0.010, -0.020, +0.000 (key tokens +0.000, -0.040, +0.000) over 3 seeds")
    one_seed = Row("LG_again", "fixed", "LG", [1, 2], [result(1, 2.01), result(2, None)])
    lines = headline_table([ref, one_seed, routed], {"routed": "y"}, "LG", floor_run="LG_again").splitlines()
    assert "better on 1, worse on 2 of 3" in lines[2] and "has 1 seed (+0.010)" in lines[-1]
    assert headline_table([ref, routed], {"routed": "y"}, "LG").splitlines()[-1].startswith("| routed")


def test_the_readmes_headline_table_regenerates_from_the_record_it_names(capsys):
    """The README's table is `compare.py GRID --headline=RECORD`, byte for byte, for the record it links."""
    import re

    import compare
    readme = open(os.path.join(ROOT, "README.md")).read()
    record = re.search(r"python compare.py (configs/grids/\w+\.py) --headline=(results/[\w-]+)", readme)
    assert record is not None
    assert compare.main([record.group(1), f"--headline={os.path.join(ROOT, record.group(2))}"]) == 0
    table = capsys.readouterr().out.split("\n\n", 2)[2]  # after the heading and the note
    assert table in readme


def test_a_grids_headline_names_runs_it_has(tmp_path):
    path = write_grid(tmp_path / "g.py", {"a": {"schedule": "L"}}, {}, extra="headline = {'reference': 'b', 'runs': {'a': 'x'}}\n")
    with pytest.raises(GridError, match="headline names 'b', not a run of the grid"):
        load_grid(path)
    path = write_grid(tmp_path / "g.py", {"a": {"schedule": "L"}}, {}, extra="headline = {'runs': ['a']}\n")
    with pytest.raises(GridError, match="headline must be"):
        load_grid(path)
    floor = "headline = {'reference': 'a', 'runs': {'a': 'x'}, 'noise_floor': %r}\n"
    with pytest.raises(GridError, match="headline names 'c', not a run of the grid"):
        load_grid(write_grid(tmp_path / "g.py", {"a": {"schedule": "L"}}, {}, extra=floor % "c"))
    with pytest.raises(GridError, match="noise_floor is its reference; name the reference's run on another data"):
        load_grid(write_grid(tmp_path / "g.py", {"a": {"schedule": "L"}}, {}, extra=floor % "a"))
    grid = load_grid(write_grid(tmp_path / "g.py", {"a": {"schedule": "L"}, "b": {"schedule": "L", "data_order": 1}},
                                {}, extra=floor % "b"))
    assert grid.headline["noise_floor"] == "b"


def test_a_records_plots_are_drawn_again_from_its_rows_and_grid_file(tmp_path, capsys):
    import shutil

    import compare
    record = tmp_path / "2026-12-05_stdlib_live_4"
    shutil.copytree(os.path.join(ROOT, "results", "2026-12-05_stdlib_live_4"), record,
                    ignore=shutil.ignore_patterns("*.png", "runs"))
    assert compare.main([f"--redraw={record}", f"--out={tmp_path / 'out'}"]) == 0
    drawn = sorted(p.name for p in record.glob("*.png"))
    assert {"pareto.png", "val_curves.png", "copy_curves.png", "comparison_curves.png",
            "heatmap_routed_at_LG.png"} <= set(drawn)
    assert not (tmp_path / "out").exists()  # planned, nothing trained


def test_the_attention_training_computed_is_the_summarys_mean_or_else_its_logs_steps(tmp_path):
    """train_summary's attention_flop_frac_training where the run kept it; for an older summary the mean of
    train.log's step lines, the last line of each step (a resume trains the steps after its checkpoint again);
    None with neither. The table shows it beside the end's only where some seed knows it."""
    job = plan(load_grid(write_grid(tmp_path / "g.py", {"routed": {"schedule": "R"}})), str(tmp_path / "out"))[0]
    os.makedirs(job.out_dir)
    summary = os.path.join(job.out_dir, "train_summary.json")
    with open(summary, "w") as f:
        json.dump({"attention_flop_frac_training": {"ideal": 0.2, "computed": 0.43, "logged_steps": 100}}, f)
    assert tables.collect(job)["flops_training"] == 0.43
    with open(summary, "w") as f:
        json.dump({}, f)
    assert tables.collect(job)["flops_training"] is None
    line = "iter {}: loss 2.0 (lm 2.0 + penalty 0; mean p 0.5, lambda 0) | global 12.5% attn-FLOPs ideal 18% " \
           "computed {}% | lr 1e-3 | 7,000 tok/s"
    with open(os.path.join(job.out_dir, "train.log"), "w") as f:
        f.write("\n".join(["step 0: val loss 5.0 | global 12.5% attn-FLOPs ideal 18% computed 106%",
                           line.format(50, 106), line.format(100, 106), line.format(150, 106),
                           "stopped by SIGTERM: saved ckpt.pt at step 120", line.format(150, 18),
                           line.format(200, 18)]) + "\n")
    assert tables.collect(job)["flops_training"] == pytest.approx((1.06 + 1.06 + 0.18 + 0.18) / 4)
    done = {"flops_ideal": 0.18, "flops_computed": 0.18}
    old = results_table([Row("routed", "routed", "RR", [1], [result(1, 1.0, **done, flops_training=None)])], {})
    assert "| computed |" in old and "| 18% |" in old
    new = results_table([Row("routed", "routed", "RR", [1], [result(1, 1.0, **done, flops_training=0.62)])], {})
    assert "| computed (end / training mean) |" in new and "| 18% / 62% |" in new


def test_head_scores_plot_every_heads_previous_token_score_and_the_non_local_layers_induction_per_seed(tmp_path):
    """A column per seed; previous-token scores of every layer's heads (top), induction scores of the heads of
    layers that are not local (middle), routed layers' global shares (bottom); step 0 and entries from before
    the per-head field are left out."""
    def entry(step, shift):
        heads = {"previous": [[0.1 + shift, 0.2], [0.3, 0.4 + shift]],
                 "induction": [[0.0, 0.0], [0.05 + shift, 0.01]], "global": [[0.0, 0.0], [1.0, 0.0]]}
        return [step, 0.1, [0.0, 0.05], heads]
    by_seed = {2: [[0, 0.0, [0.0, 0.0]], entry(250, 0.0), entry(500, 0.1)], 1: [entry(0, 0.0), entry(250, 0.2)]}
    fig = plots.head_scores(tmp_path / "heads.png", "LR_one_global_head", by_seed, "LR")
    axes = fig.axes
    assert [ax.get_title() for ax in axes[:2]] == ["seed 1", "seed 2"]
    top_seed2, bottom_seed2 = axes[1], axes[3]
    assert [line.get_xydata().tolist() for line in top_seed2.lines] == [
        [[250, 0.1], [500, pytest.approx(0.2)]], [[250, 0.2], [500, 0.2]], [[250, 0.3], [500, 0.3]],
        [[250, 0.4], [500, pytest.approx(0.5)]]]
    # the local first layer has no induction line; the routed layer's two heads do
    assert [line.get_xydata().tolist() for line in bottom_seed2.lines] == [[[250, 0.05], [500, pytest.approx(0.15)]],
                                                                           [[250, 0.01], [500, 0.01]]]
    assert len(axes[0].lines) == 4 and len(axes[2].lines) == 2  # seed 1: step 0 left out, one point a line
    assert [t.get_text() for t in axes[1].get_legend().get_texts()] == [
        "layer 0 (L) head 0", "layer 0 (L) head 1", "layer 1 (R) head 0", "layer 1 (R) head 1"]
    # the routed layer's heads' global share (bottom row); the local layer has none
    assert [line.get_xydata().tolist() for line in axes[5].lines] == [[[250, 1.0], [500, 1.0]],
                                                                       [[250, 0.0], [500, 0.0]]]
    assert axes[4].get_ylabel() == "global share" and len(axes) == 6
    data = (tmp_path / "heads.png").read_bytes()
    assert data.startswith(b"\x89PNG") and 5_000 < len(data) < 150_000


def test_a_records_tables_count_same_seed_differences_against_the_grids_noise_floor():
    """With the headline's noise floor, the record's same-seed columns and comparisons say on how many seeds a
    row is better, worse or within it (not 'tie' unless every seed agrees); the floor's rerun of the reference
    is no candidate for best fixed; with one seed of the floor row, ties are differences under 0.0005 again."""
    from nanoaha.grid.tables import record_floors, record_table
    ref = Row("LG", "fixed", "LG", [1, 2, 3], [result(1, 2.0), result(2, 2.1), result(3, 2.2)])
    again = Row("LG_again", "fixed", "LG", [1, 2, 3], [result(1, 1.99), result(2, 2.08), result(3, 2.2)])
    routed = Row("routed", "routed", "RR", [1, 2, 3], [result(1, 1.95), result(2, 2.115), result(3, 2.3)])
    local = Row("local", "fixed", "LL", [1, 2, 3], [result(1, 2.5), result(2, 2.6), result(3, 2.7)])
    rows, refs = [local, ref, again, routed], {"local": "local", "dense": "LG"}
    headline = {"reference": "LG", "runs": {"routed": "r"}, "noise_floor": "LG_again"}
    floor = record_floors(rows, headline)
    assert floor.run == "LG_again" and floor.values["val_loss"] == pytest.approx(0.02)
    table = record_table(rows, refs, {"routed vs LG": ("routed", "LG")}, floor)
    cells = table_cells(table)
    assert cells["routed vs LG"][2] == "+0.022 [-0.050, +0.100], better on 1, worse on 1, within \u00b10.020 on 1 of 3"
    assert cells["routed"][-3].endswith("within \u00b10.020 on 1 of 3")  # vs best fixed: LG, not its rerun
    assert "not a candidate" in table and "within the noise floor: \u00b10.020" in table
    assert record_floors(rows, {"reference": "LG", "runs": {}}) is None
    one_seed = Row("LG_again", "fixed", "LG", [1, 2, 3], [result(1, 1.99), result(2, None), result(3, None)])
    floor = record_floors([local, ref, one_seed, routed], headline)
    assert floor.values["val_loss"] is None
    cells = table_cells(record_table([local, ref, one_seed, routed], refs, {"routed vs LG": ("routed", "LG")}, floor))
    assert cells["routed vs LG"][2] == "+0.022 [-0.050, +0.100] tie"
