"""The repair benchmark's flawed starting harnesses (benchmarks/flawed/<domain>/<name>/): each is a valid harness,
documented, and its defect shows in the evidence of a short real training run, where the offline Planner's first
proposal is its repair."""

from __future__ import annotations

import functools
import importlib.util
import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest

from evotrainer.agents.offline.policy import OfflinePolicy
from evotrainer.agents.schemas import DiagnoseInput, PlanInput
from evotrainer.compare.hpo import current, propose, space, template_recipe
from evotrainer.trainer import jobs
from evotrainer.trainer.diagnostics.report import health_report
from evotrainer.trainer.grpo import TrainSpec
from evotrainer.workspaces.source import starting_harness

FLAWED = Path(__file__).resolve().parent.parent / "benchmarks" / "flawed"
# harness -> (the analyzer its defect shows in, the catalog transform that repairs it)
DEFECTS = {
    "math/answer_line_everywhere": ("unpaid_correct", "answer_parser"),
    "math/cold_sampler": ("identical_samples", "temperature"),
    "math/pairs": ("small_groups", "more_generations"),
    "math/short_limit": ("truncation", "longer_limit"),
    "math/low_lr": ("update_size", "learning_rate"),
    "code/low_lr": ("update_size", "learning_rate"),
    "code/short_limit": ("truncation", "longer_limit"),
    "code/cold_pairs": ("identical_samples", "temperature"),  # and small_groups, more_generations: its second defect
    "swe/history_leak": ("leak_usage", "close_leak"),
    "swe/short_turns": ("context_overflow", "more_turns"),
    "swe/leaky_short": ("leak_usage", "close_leak"),  # and its turn budget: context_overflow, more_turns
}
SECOND = {"code/cold_pairs": ("small_groups", "more_generations"),  # harnesses with two defects
          "swe/leaky_short": ("context_overflow", "more_turns")}
RECORDED = Path(__file__).resolve().parent / "data" / "flawed"  # evidence of real runs (record_evidence.py)


@functools.cache
def _repair_benchmark():
    """benchmarks/repair.py as a module (the benchmarks are scripts, not a package)."""
    spec = importlib.util.spec_from_file_location("repair_benchmark", FLAWED.parent / "repair.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_suite_is_what_the_table_says_and_every_harness_is_valid_and_documented(tmp_path):
    found = sorted(str(p.parent.relative_to(FLAWED)) for p in FLAWED.glob("*/*/harness.yaml"))
    assert found == sorted(DEFECTS)
    for name in found:
        path = FLAWED / name
        assert jobs.validate_harness(path, tmp_path) == [], name
        readme = (path / "README.md").read_text()
        for part in ("**Defect**", "**How it gets written**", "**Evidence**", "**Repair**"):
            assert part in readme, (name, part)
        analyzer, transform = DEFECTS[name]
        assert f"`{analyzer}`" in readme and f"`{transform}`" in readme, name
        # the benchmark reads every defect of a harness from its README, in this order
        assert _repair_benchmark().defects_of(path) == [DEFECTS[name], *([SECOND[name]] if name in SECOND else [])]
        start = starting_harness(None, path)
        assert start.domain == name.split("/")[0] and "README.md" not in start.files
        # the hyperparameter search's first trial is this harness's own recipe, exactly (its space holds it)
        recipe = template_recipe(start)
        assert propose(space(recipe), [], 0, 0, 2, recipe) == current(recipe), name
        # nothing in the files the agents read names the defect
        text = "\n".join((path / f).read_text() for f in start.files).lower()
        assert not re.search(r"\b(defect|flaw|bug|wrong|too (low|small|short|cold))\b", text), name


def test_the_repair_table_counts_every_defect_of_a_harness_and_reads_the_first_format(tmp_path):
    repair = _repair_benchmark()
    # a seed kept in the first format (one analyzer, flat keys), its run directories gone: it answers for the first
    # defect; the second is unknown, not silently repaired
    (tmp_path / "repair").mkdir()
    (tmp_path / "repair" / "s0.json").write_text(json.dumps({"segment": [1, "control"], "analyzer_silent_at_end": True,
                                                             "reference_analyzer_fires": True}))
    checks = repair.evidence_checks(tmp_path, 0, FLAWED / "code" / "cold_pairs", ["identical_samples", "small_groups"])
    assert checks == {"identical_samples": (True, True), "small_groups": (None, None)}

    def seed(s, first, second):
        return {"seed": s, "invalid": 0, "steps": {"evotrainer": 140, "reference": 60, "hpo": 140},
                "defects": [{"analyzer": "identical_samples", "repair": "temperature", "repaired": first,
                             "generation": 1 if first else None, "reference_analyzer_fires": True},
                            {"analyzer": "small_groups", "repair": "more_generations", "repaired": second,
                             "generation": 2 if second else None, "reference_analyzer_fires": True}]}
    row = {"harness": "cold_pairs", "defects": [{"analyzer": "identical_samples", "repair": "temperature"},
                                                {"analyzer": "small_groups", "repair": "more_generations"}],
           "seeds": [seed(0, True, True), seed(1, True, False), seed(2, False, False)],
           "evotrainer": 0.5, "reference": 0.45, "hpo": 0.47, "vs_reference": [0.05, 0.01, 0.09], "vs_hpo": None}
    md = repair.table([row])
    assert "| 2/3; 1/3 | 1, 1; 2 | 3/3; 3/3 |" in md
    assert "Defects repaired in 3 of 6 (defect, seed) pairs;" in md and "lower bound > 0 on 1 of 1" in md
    # a repair promoted on a seed whose champion evidence could not be read: not counted, and said
    row["seeds"][2]["defects"][0].update(generation=2, analyzer_silent_at_end=None)
    md = repair.table([row])
    assert "| 2/3 (1 promoted, evidence unreadable); 1/3 | 1, 1, (2); 2 |" in md
    assert "Defects repaired in 3 of 6 (defect, seed) pairs (1 promoted, evidence unreadable, not counted);" in md


def test_every_test_of_a_repair_is_listed_and_those_after_its_promotion_are_not_counted():
    repair = _repair_benchmark()

    def test(generation, decision, effect=None, mde=None, gates=()):
        ci = (None, None) if effect is None else (effect - 0.02, effect + 0.02)
        return {"generation": generation, "decision": decision, "effect": effect, "ci_low": ci[0], "ci_high": ci[1],
                "mde": mde, "p_gain": None if effect is None else 0.5, "failed_gates": list(gates)}

    def seed(s, generation, tests):
        return {"seed": s, "defects": [{"analyzer": "update_size", "repair": "learning_rate", "generation": generation,
                                        "tests": tests}]}
    fixed = {**test(1, "promote", -0.004, 0.03), "fixes": ["update_size/update_ratio"], "repairs": []}
    row = {"harness": "low_lr", "seeds": [
        seed(0, 1, [fixed, test(2, "reject", -0.03, 0.03)]),  # the second: applied again
        seed(1, None, [test(1, "inconclusive", 0.012, 0.030), test(2, "inconclusive", -0.004, 0.030)]),
        seed(2, None, [test(1, "reject", gates=["replay_agreement"]), test(2, "reject", -0.02, 0.028),
                       test(3, "reject")])]}  # the last: its backtest failed, nothing measured
    md = repair.tests_table([row])
    assert md.count("| low_lr | `learning_rate` |") == 7
    assert "| low_lr | `learning_rate` | 0 | 2 | -0.030 [-0.050, -0.010] | 0.030 | 0.50 | reject, applied again" in md
    assert "| 2 | 1 | - | - | - | reject (replay_agreement) |" in md
    assert "| 0 | 1 | -0.004 [-0.024, +0.016] | 0.030 | 0.50 | promote; fixes `update_size/update_ratio` |" in md
    assert ("6 tests of a defect's repair while the defect stood: 1 promoted, 1 rejected on their measurement, 1 "
            "blocked by a gate, 2 inconclusive (1 of them a gain below the test's minimum detectable effect), 1 "
            "decided without a measurement; median MDE 0.030. 1 more applied a promoted repair again "
            "(not counted).") in md
    assert repair.tests_table([{"harness": "clean", "seeds": [{"seed": 0, "defects": []}]}]).startswith("No test")


def test_an_unreadable_champion_segment_is_unknown_and_not_kept(tmp_path, monkeypatch):
    """The check that the analyzer is silent at the end of the champion's line: where that evidence cannot be read,
    the answer is unknown (not silent, which would count the defect repaired), and it is not kept, so that a
    later run with the evidence readable answers it; the reference's half, readable, is kept on its own."""
    repair = _repair_benchmark()
    for d in ("runs/evotrainer-s1/evidence", "static/reference-s1/evidence"):
        (tmp_path / d).mkdir(parents=True)
    monkeypatch.setattr(repair, "last_segment", lambda run: (2, "control"))
    readable = {"champion": False}

    def fires(evidence_dir, generation, branch, harness, analyzer, work):
        if "evotrainer-s1" in str(evidence_dir):
            return False if readable["champion"] else None  # silent when readable; unreadable: None
        return True

    monkeypatch.setattr(repair, "fires", fires)
    harness = FLAWED / "math" / "low_lr"
    assert repair.evidence_checks(tmp_path, 1, harness, ["update_size"]) == {"update_size": (None, True)}
    assert json.loads((tmp_path / "repair" / "s1.json").read_text())["analyzers"] == \
        {"update_size": {"reference_fires": True}}
    readable["champion"] = True
    assert repair.evidence_checks(tmp_path, 1, harness, ["update_size"]) == {"update_size": (True, True)}
    kept = json.loads((tmp_path / "repair" / "s1.json").read_text())
    assert kept == {"segment": [2, "control"], "analyzers": {"update_size": {"silent_at_end": True,
                                                                             "reference_fires": True}},
                    "cells": {"evotrainer": None, "reference": None}}  # no cell files in this test


def test_each_half_of_a_seeds_evidence_checks_is_kept_when_its_cell_is_done(tmp_path, monkeypatch):
    """A seed whose EvoTrainer cell is done and whose reference cell is still training: the champion's half is read
    and kept (a later sitting on a machine without the EvoTrainer run still knows it), the reference's half, its run
    directory incomplete, is not read until its cell is done."""
    repair = _repair_benchmark()
    for d in ("runs/evotrainer-s0/evidence", "static/reference-s0/evidence"):
        (tmp_path / d).mkdir(parents=True)
    monkeypatch.setattr(repair, "last_segment", lambda run: (3, "cand/g3-x"))
    read = []

    def fires(evidence_dir, generation, branch, harness, analyzer, work):
        read.append(evidence_dir.parent.name)
        return "reference" in str(evidence_dir)

    monkeypatch.setattr(repair, "fires", fires)
    harness = FLAWED / "math" / "low_lr"
    halves = repair.evidence_checks(tmp_path, 0, harness, ["update_size"], reference_done=False)
    assert halves == {"update_size": (True, None)} and read == ["evotrainer-s0"]
    shutil.rmtree(tmp_path / "runs")  # the next sitting, elsewhere: only the committed files
    assert repair.evidence_checks(tmp_path, 0, harness, ["update_size"]) == {"update_size": (True, True)}
    assert read == ["evotrainer-s0", "reference-s0"]
    kept = json.loads((tmp_path / "repair" / "s0.json").read_text())
    assert kept == {"segment": [3, "cand/g3-x"], "analyzers": {"update_size": {"silent_at_end": True,
                                                                             "reference_fires": True}},
                    "cells": {"evotrainer": None, "reference": None}}  # no cell files in this test
    repair.evidence_checks(tmp_path, 0, harness, ["update_size"])  # both kept: nothing read again
    assert read == ["evotrainer-s0", "reference-s0"]


def test_a_kept_half_answers_only_for_the_cell_it_was_read_beside(tmp_path, monkeypatch):
    """A reference cell computed again (compare sets a stale one aside when EvoTrainer's line grows) and an
    EvoTrainer cell computed again under a changed loop have their halves read anew from their own runs; a cell
    computed again to the same measurement, in other seconds, keeps its half; a half kept before identities were is
    taken to belong to the cells on record."""
    repair = _repair_benchmark()
    for d in ("runs/evotrainer-s0/evidence", "static/reference-s0/evidence", "cells", "repair"):
        (tmp_path / d).mkdir(parents=True)
    monkeypatch.setattr(repair, "last_segment", lambda run: (3, "control"))
    answers = {"evotrainer": True, "reference": True}  # what each run's evidence says when read
    read = []

    def fires(evidence_dir, generation, branch, harness, analyzer, work):
        arm = "reference" if "reference" in str(evidence_dir) else "evotrainer"
        read.append(arm)
        return answers[arm]

    def write_cell(arm, main_steps, seconds, accuracy=0.5):
        (tmp_path / "cells" / f"{arm}-s0.json").write_text(json.dumps(
            {"arm": arm, "seed": 0, "main_steps": main_steps, "test_accuracy": accuracy, "wall_seconds": seconds}))

    monkeypatch.setattr(repair, "fires", fires)
    harness, kept = FLAWED / "math" / "low_lr", tmp_path / "repair" / "s0.json"
    # kept before identities were: adopted by the cells on record, nothing read again
    write_cell("evotrainer", 60, 100.0)
    write_cell("reference", 60, 50.0)
    kept.write_text(json.dumps({"segment": [3, "control"], "analyzers": {
        "update_size": {"silent_at_end": False, "reference_fires": True}}}))
    assert repair.evidence_checks(tmp_path, 0, harness, ["update_size"]) == {"update_size": (False, True)}
    assert read == [] and set(json.loads(kept.read_text())["cells"]) == {"evotrainer", "reference"}
    # the same EvoTrainer measurement in other seconds: its half stands
    write_cell("evotrainer", 60, 140.0)
    assert repair.evidence_checks(tmp_path, 0, harness, ["update_size"]) == {"update_size": (False, True)}
    assert read == []
    # EvoTrainer computed again, now promoting: its half is read from its run, the reference's stands
    answers["evotrainer"] = False
    write_cell("evotrainer", 80, 150.0, accuracy=0.55)
    assert repair.evidence_checks(tmp_path, 0, harness, ["update_size"]) == {"update_size": (True, True)}
    assert read == ["evotrainer"]
    # the reference set aside as stale and training again: its half is gone, not read from a run in progress
    (tmp_path / "cells" / "reference-s0.json").unlink()
    assert repair.evidence_checks(tmp_path, 0, harness, ["update_size"], reference_done=False) == \
        {"update_size": (True, None)}
    assert "reference_fires" not in json.loads(kept.read_text())["analyzers"]["update_size"]
    # its new cell done: read from its new run, and kept beside it
    answers["reference"] = False
    write_cell("reference", 80, 70.0)
    assert repair.evidence_checks(tmp_path, 0, harness, ["update_size"]) == {"update_size": (True, False)}
    assert read == ["evotrainer", "reference"]
    assert repair.evidence_checks(tmp_path, 0, harness, ["update_size"]) == {"update_size": (True, False)}
    assert read == ["evotrainer", "reference"]


def test_again_sets_each_loop_cell_aside_once_and_a_rerun_keeps_what_it_computed(tmp_path):
    """`--again TAG` after a change to the loop: each EvoTrainer cell on record is set aside with its run directory
    (which the loop would resume, finished, to the same cell), the baselines stay; the same command run again, as
    a resume, sets aside nothing that the first computed."""
    repair = _repair_benchmark()
    cells, runs, skills = tmp_path / "cells", tmp_path / "runs", tmp_path / "skills"
    for s in (0, 1):
        (runs / f"evotrainer-s{s}").mkdir(parents=True)
        (skills / f"evotrainer-s{s}").mkdir(parents=True)  # each run's own memory: its lessons go aside with it
    (skills / "reference-s0").mkdir()
    cells.mkdir()
    for name in ("evotrainer-s0", "evotrainer-s1", "reference-s0", "hpo-s0"):
        (cells / f"{name}.json").write_text(json.dumps({"cell": name}))
    assert repair.set_aside_loop_cells(tmp_path, 3, "before-x") == [0, 1, 2]
    assert sorted(p.name for p in cells.iterdir()) == ["evotrainer-s0.before-x.json", "evotrainer-s1.before-x.json",
                                                       "evotrainer-s2.before-x.json", "hpo-s0.json",
                                                       "reference-s0.json"]
    assert json.loads((cells / "evotrainer-s1.before-x.json").read_text()) == {"cell": "evotrainer-s1"}
    assert json.loads((cells / "evotrainer-s2.before-x.json").read_text()) is None  # nothing was on record
    assert sorted(p.name for p in runs.iterdir()) == ["evotrainer-s0.before-x", "evotrainer-s1.before-x"]
    assert sorted(p.name for p in skills.iterdir()) == ["evotrainer-s0.before-x", "evotrainer-s1.before-x",
                                                        "reference-s0"]
    # the loop computes seed 0 again, then the run is stopped and resumed with the same command
    (runs / "evotrainer-s0").mkdir()
    (skills / "evotrainer-s0").mkdir()
    (cells / "evotrainer-s0.json").write_text(json.dumps({"cell": "new"}))
    assert repair.set_aside_loop_cells(tmp_path, 3, "before-x") == []
    assert json.loads((cells / "evotrainer-s0.json").read_text()) == {"cell": "new"}
    assert (runs / "evotrainer-s0").is_dir() and (skills / "evotrainer-s0").is_dir()  # a resume keeps its memory
    # another change later, another tag: the second computation is set aside in its turn
    assert repair.set_aside_loop_cells(tmp_path, 1, "before-y") == [0]
    assert json.loads((cells / "evotrainer-s0.before-y.json").read_text()) == {"cell": "new"}


def test_status_tells_done_computing_stale_and_left_from_the_cells_alone(tmp_path):
    """`--status` on a benchmark spread over sittings: a written cell is done, one whose lock a process holds is being
    computed, the rest are left; a baseline matched to other steps than its seed's EvoTrainer cell now has is stale
    (compare will compute it again), as is a search whose trial count those steps no longer pay for. What is left is
    timed at the median wall time of its arm's cells on record in the domain."""
    from filelock import FileLock

    repair = _repair_benchmark()
    cells = tmp_path / "math-pairs" / "cells"
    cells.mkdir(parents=True)

    def cell(name: str, main: int, total: int, acc: float, trials: int | None = None, minutes: float = 10,
             into: Path = cells) -> None:
        from evotrainer.compare.hpo import Search, Trial
        from evotrainer.compare.results import Cell

        arm, seed = name.rsplit("-s", 1)
        search = Search(trial_steps=20, chosen=0, startup=2,
                        trials=[Trial(number=i, params={}, dev_accuracy=0.5, checkpoint="") for i in range(trials)]) \
            if trials is not None else None
        into.mkdir(parents=True, exist_ok=True)
        (into / f"{name}.json").write_text(Cell(
            arm=arm, seed=int(seed), checkpoint="", main_steps=main, total_steps=total, cpu_seconds=0.0,
            wall_seconds=minutes * 60, test_accuracy=acc, test_avg_at_k=acc, item_ids=[], greedy_correct=[],
            search=search).model_dump_json())

    cell("evotrainer-s0", 100, 180, 0.568, minutes=20)
    cell("evotrainer-s1", 80, 160, 0.5555, minutes=30)
    cell("reference-s0", 80, 80, 0.499, minutes=8)  # matched to seed 0's line before it grew
    cell("reference-s1", 80, 80, 0.4965, minutes=10)
    cell("hpo-s1", 80, 160, 0.534, trials=5, minutes=25)  # (160 - 60) // 20
    cell("hpo-s0", 100, 160, 0.5345, trials=4, minutes=25)  # the line's steps, but 180 steps pay for 5 trials
    (cells / "evotrainer-s1.before-x.json").write_text("null\n")
    # timing: the domain's cells on record in any harness, not a set-aside one, not another domain's
    clean = tmp_path / "math-clean" / "cells"
    cell("evotrainer-s1", 80, 160, 0.5, minutes=900, into=clean)
    (clean / "evotrainer-s1.json").rename(clean / "evotrainer-s1.before-y.json")
    cell("evotrainer-s0", 80, 160, 0.5, minutes=40, into=clean)
    cell("evotrainer-s0", 80, 160, 0.5, minutes=6, into=tmp_path / "code-low_lr" / "cells")
    with FileLock(cells / "hpo-s2.lock"):  # another process is computing it
        table = repair.status(tmp_path, "math", ["pairs", "low_lr"], 3)
    lines = table.splitlines()
    assert lines[0].split(" | ")[1:4] == ["evotrainer s0", "evotrainer s1", "evotrainer s2"]
    row = [c.strip() for c in lines[2].strip("|").split("|")]
    assert row[0] == "math/pairs"
    assert row[1:4] == ["done (100 steps, 0.5680)", "done (80 steps, 0.5555)", "to do"]
    assert row[4] == "done (80 steps, 0.4990, stale: trained 80 main-line steps, EvoTrainer's line now has 100)"
    assert row[5] == "done (80 steps, 0.4965)" and row[6] == "to do"
    assert row[7] == "done (100 steps, 0.5345, stale: ran 4 trials, EvoTrainer's steps now pay for 5)"
    assert row[8] == "done (80 steps, 0.5340)" and row[9] == "computing"
    assert row[10] == "evotrainer-s1.before-x.json"
    assert lines[3].split(" | ")[1:] == ["to do"] * 9 + ["- |"]  # a harness not started: no directory yet
    assert not (tmp_path / "math-low_lr").exists() and not (cells / "hpo-s1.lock").exists()  # status wrote nothing
    assert "computing" not in repair.status(tmp_path, "math", ["pairs"], 3).splitlines()[2]  # the lock released
    # left: pairs' evotrainer s2, reference s0 (stale) and s2, hpo s0 (stale) and s2 (computing), low_lr's nine
    assert lines[-1] == ("Left: 14 cells (evotrainer 4, reference 5, hpo 5; a cell computing counted whole). One at a "
                         "time, at the median wall time of the domain's cells on record (evotrainer 30 min from 3, "
                         "reference 9 min from 2, hpo 25 min from 2): about 4.8 h.")  # (4 * 30 + 5 * 9 + 5 * 25) / 60
    assert repair.status(tmp_path, "code", ["low_lr"], 1).splitlines()[-1] == (
        "Left: 2 cells (reference 1, hpo 1; a cell computing counted whole). No cell of their arms is on record to "
        "time them.")
    assert repair.status(tmp_path, "code", ["cold_pairs"], 1).splitlines()[-1].endswith(
        "(evotrainer 6 min from 1): about 0.1 h, plus the 2 cells of reference, hpo, with no cell of their arm on "
        "record to time them.")
    (cells / "evotrainer-s2.json").write_text((cells / "evotrainer-s1.json").read_text())
    cell("reference-s0", 100, 100, 0.5)  # the stale ones computed again for seed 0's line, the others computed
    cell("hpo-s0", 100, 180, 0.5, trials=5)
    cell("reference-s2", 80, 80, 0.5)
    cell("hpo-s2", 80, 160, 0.5, trials=5)
    assert repair.status(tmp_path, "math", ["pairs"], 3).splitlines()[-1] == "Left: nothing, every cell is done."


def test_the_table_is_the_record_recomputed_and_leaves_out_what_is_not_done(tmp_path, monkeypatch):
    """`--table` builds each row from the cells on record and the evidence kept beside them alone, computing and
    writing nothing: the committed table is a command anyone can rerun. A harness with a cell left to do or a stale
    baseline is named, not counted; a kept evidence half read beside another cell than the one on record answers
    nothing."""
    from evotrainer.compare.hpo import Search, Trial, trial_count
    from evotrainer.compare.report import search_effect_of
    from evotrainer.compare.results import Cell, summarize

    repair = _repair_benchmark()
    rng = np.random.default_rng(0)
    items = [f"q{i}" for i in range(60)]

    def write(cmp_dir: Path, arm: str, seed: int, main: int, total: int, p: float, decisions=()) -> Cell:
        lineage = [{"generation": g, "transform": t, "decision": d, "effect": 0.01, "ci_low": -0.01, "ci_high": 0.03,
                    "mde": 0.03, "p_gain": 0.9, "failed_gates": [], "repairs": [], "fixes": []}
                   for g, t, d in decisions]
        search = Search(trial_steps=20, chosen=0, startup=2, trials=[
            Trial(number=i, params={}, dev_accuracy=0.5, checkpoint="") for i in range(trial_count(total, main, 20))]) \
            if arm == "hpo" else None
        correct = (rng.random(len(items)) < p).tolist()
        cell = Cell(arm=arm, seed=seed, checkpoint="", main_steps=main, total_steps=total, cpu_seconds=1.0,
                    wall_seconds=1.0, test_accuracy=float(np.mean(correct)), test_avg_at_k=0.0, item_ids=items,
                    greedy_correct=correct, lineage=lineage, search=search,
                    promotions=[{"generation": 1, "invalid": False}] if any(d == "promote" for *_, d in decisions)
                    else [])
        (cmp_dir / "cells").mkdir(parents=True, exist_ok=True)
        (cmp_dir / "cells" / f"{arm}-s{seed}.json").write_text(cell.model_dump_json())
        return cell

    done = tmp_path / "math-low_lr"
    cells = []
    for s, decision in enumerate(["promote", "promote", "inconclusive"]):
        cells += [write(done, "evotrainer", s, 80, 160, 0.6, [(1, "learning_rate", decision)]),
                  write(done, "reference", s, 80, 80, 0.45), write(done, "hpo", s, 80, 160, 0.5)]
    digest, weights = starting_harness(None, FLAWED / "math" / "low_lr").digest, repair.shipped_start("math")
    (done / "request.json").write_text(json.dumps({"domain": "math", "harness": digest, "start_weights": weights}))
    (done / "repair").mkdir()
    for s, silent in enumerate([True, False, False]):
        ids = {a: repair.cell_identity(done / "cells" / f"{a}-s{s}.json") for a in ("evotrainer", "reference")}
        if s == 2:
            ids["reference"] = "read-beside-an-older-cell"
        (done / "repair" / f"s{s}.json").write_text(json.dumps({"segment": [3, "control"], "cells": ids, "analyzers": {
            "update_size": {"silent_at_end": silent, "reference_fires": True}}}))
    stale = tmp_path / "math-pairs"  # every cell written, one matched to a shorter line than its seed's now
    for s in range(3):
        write(stale, "evotrainer", s, 80, 160, 0.6, [(1, "more_generations", "promote")])
        write(stale, "reference", s, 60 if s == 1 else 80, 60 if s == 1 else 80, 0.5)
        write(stale, "hpo", s, 80, 160, 0.5)
    (stale / "request.json").write_text(json.dumps({"domain": "math", "harness": "0"}))
    part = tmp_path / "math-cold_sampler"
    evo = write(part, "evotrainer", 0, 80, 160, 0.6)
    (part / "cells" / "evotrainer-s1.before-x.json").write_text(evo.model_dump_json())  # set aside: not on record
    def files() -> dict:
        return {p.relative_to(tmp_path): p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}

    # the run directories beside the cells are there, yet the table reads none of them (seed 2's dropped reference
    # half is not read again from its run: the comparison answers it when it resumes, not the table)
    for run in (done / "runs" / "evotrainer-s2", done / "static" / "reference-s2"):
        run.mkdir(parents=True)

    def no_reading(*_):
        raise AssertionError("--table read a run directory")

    monkeypatch.setattr(repair, "fires", no_reading)
    monkeypatch.setattr(repair, "last_segment", no_reading)
    before = files()

    row, why = repair.on_record(tmp_path, "math", "low_lr", 3)
    summary = {x.arm: x for x in summarize(cells, repair.ARMS)}
    assert why == "" and row["evotrainer"] == summary["evotrainer"].test_accuracy
    assert row["vs_reference"] == summary["evotrainer"].vs_reference  # the same bootstrap as compare's
    assert [x["defects"][0]["repaired"] for x in row["seeds"]] == [True, False, False]
    assert [x["defects"][0]["reference_analyzer_fires"] for x in row["seeds"]] == [True, True, None]
    md = repair.table([row])
    assert "| low_lr | `update_size` -> `learning_rate` | 1/3 | 1, (1) | 2/3 |" in md and "*:" not in md
    assert list(row["vs_hpo"]) == list(search_effect_of(cells, [0, 1, 2])[:3])
    assert repair.on_record(tmp_path, "math", "pairs", 3) == (None, "math/pairs: 8 of 9 cells done, reference-s1 "
                                                                     "stale")
    assert repair.on_record(tmp_path, "math", "cold_sampler", 3) == (
        None, "math/cold_sampler: 1 of 9 cells done, evotrainer-s1, evotrainer-s2, reference-s0, reference-s1, "
              "reference-s2, hpo-s0, hpo-s1, hpo-s2 to do")
    assert repair.on_record(tmp_path, "math", "short_limit", 3) == (None, "math/short_limit: 0 of 9 cells done")
    assert files() == before  # nothing written (the kept half read beside an older cell is not dropped on disk)
    # a record is of the harness and the start the package has now, or it is named and not counted
    (done / "request.json").write_text(json.dumps({"harness": digest, "start_weights": "0" * 16}))
    assert repair.on_record(tmp_path, "math", "low_lr", 3) == (
        None, f"math/low_lr: its cells started from weights {'0' * 16}, the package ships {weights}")
    (done / "request.json").write_text(json.dumps({"harness": "a" * 12, "start_weights": weights}))
    assert repair.on_record(tmp_path, "math", "low_lr", 3) == (
        None, f"math/low_lr: its cells were computed for harness {'a' * 12}, which is {digest} now")
    (done / "request.json").write_text(json.dumps({"harness": digest}))  # recorded before start weights were
    md = repair.table([repair.on_record(tmp_path, "math", "low_lr", 3)[0]])
    assert "| low_lr* | `update_size`" in md and "*: computed before comparisons recorded the weights" in md
    (done / "request.json").unlink()
    assert repair.on_record(tmp_path, "math", "low_lr", 3)[0] is None
    two = repair.table([row, {**row, "domain": "code"}])
    assert "| math/low_lr |" in two and "| code/low_lr |" in two  # named with their domains where mixed


def test_the_table_is_written_between_its_markers_and_nowhere_else(tmp_path):
    repair = _repair_benchmark()
    begin, end = repair.MARKERS
    doc = tmp_path / "README.md"
    doc.write_text(f"# Results\n\nwhat it shows\n{begin}\nthe old table\n{end}\nhow it was computed\n")
    repair.write_between_markers(doc, "| the new table |")
    assert doc.read_text() == (f"# Results\n\nwhat it shows\n{begin}\n\n| the new table |\n\n{end}\n"
                               "how it was computed\n")
    repair.write_between_markers(doc, "| again |")  # written again: the same place, nothing accumulates
    assert doc.read_text().count("|") == 2 and "new table" not in doc.read_text()
    for broken in (f"{end}\n{begin}\n", f"{begin}\n", "no markers\n",  # out of order, one missing, none
                   f"{begin}\n{end}\n{begin}\n{end}\n",  # twice: which table is meant is not known
                   f"see {begin}\nprose\n{end}\n"):  # a marker quoted in a line of prose is not one
        doc.write_text(broken)
        with pytest.raises(SystemExit, match="to write the table between"):
            repair.write_between_markers(doc, "| table |")
        assert doc.read_text() == broken
    doc.write_text(f"top\n{begin}\nold\n{end}")  # the end marker on the last line, no newline after it
    repair.write_between_markers(doc, "| t |")
    assert doc.read_text() == f"top\n{begin}\n\n| t |\n\n{end}" and repair.between_markers(doc.read_text()) == "| t |"


def test_a_selection_names_harnesses_across_domains_and_the_template_only_where_asked():
    repair = _repair_benchmark()
    every = repair.selected("all", "", False)
    assert len(every) == len(DEFECTS) and ("swe", "short_turns") in every and ("math", "clean") not in every
    assert repair.selected("all", "low_lr", True) == [("math", "clean"), ("math", "low_lr"), ("code", "clean"),
                                                      ("code", "low_lr")]  # no swe template: no swe harness named
    assert repair.selected("all", "clean", False) == [(d, "clean") for d in repair.DOMAINS]
    assert repair.selected("code", "", True)[0] == ("code", "clean")
    for domain, only in (("maths", ""), ("swe", "low_lr"), ("all", "nope")):
        with pytest.raises(SystemExit, match="choose from"):
            repair.selected(domain, only, False)


def test_the_committed_repair_table_is_the_records():
    """docs/results/repair/README.md's table is what `repair.py --table --clean --out docs/results/repair` computes
    from the cells committed beside it: a row edited by hand, or cells committed without the table written again
    (`--into`), fails here."""
    repair = _repair_benchmark()
    docs = FLAWED.parent.parent / "docs" / "results" / "repair"
    committed = repair.between_markers((docs / "README.md").read_text())
    assert committed == repair.record_table(docs, repair.selected("all", "", True), 3)


def test_every_swe_harness_carries_the_templates_calibrated_thresholds():
    """The swe thresholds are calibrated on the swe policy's own healthy training and written into the template and
    each flawed copy (a complete harness each): a copy that drifts from the template judges its evidence by other
    thresholds than the loop's other swe runs, and its row would not measure the defect alone."""
    from evotrainer.trainer.harness import load_spec
    from evotrainer.workspaces import TEMPLATES

    template = load_spec(TEMPLATES / "swe").analyzers
    assert template["context_overflow"] == {"warning": 0.60, "critical": 0.80}
    for name in sorted(n for n in DEFECTS if n.startswith("swe/")):
        assert load_spec(FLAWED / name).analyzers == template, name


def _short_run(policy: Path, harness: Path, work: Path, steps: int) -> Path:
    spec = TrainSpec(domain="math", checkpoint=str(policy), harness_dir=str(harness), steps=steps, seed=0,
                     out_dir=str(work), checkpoint_id="policy", checkpoints_dir=str(work / "checkpoints"),
                     evidence_dir=str(work / "evidence"), run="flawed", harness_commit="flawed",
                     result_path=str(work / "specs" / "train.result.json"))
    jobs.train(spec, work)
    return work / "evidence"


@pytest.fixture(scope="module")
def warm_math(cache_dir, tmp_path_factory) -> Path:
    """The default math policy: the one the package ships (trainer/policies/), copied into the session's cache with
    no warm-up; the defects need a policy that solves some tasks, which the tiny test policy does not."""
    from evotrainer.trainer.policy import SHIPPED

    policy = jobs.warm_policy("math", 0, tmp_path_factory.mktemp("warm"))
    assert policy.parent == cache_dir / "policies" and (SHIPPED / policy.name / "meta.json").is_file()
    return policy


def _shows_and_is_repaired(name: str, evidence: Path, work: Path) -> None:
    """Its analyzer (both, for two defects) fires on the evidence, and the offline Planner's plan of two starts with
    its repair (and holds the second defect's)."""
    analyzer, transform = DEFECTS[name]
    harness = FLAWED / name
    report = health_report(evidence, harness_dir=harness, work_dir=work)
    fired = {f.analyzer for f in report.findings if f.severity != "info"}
    assert {analyzer, *SECOND.get(name, ())[:1]} <= fired, (name, [f.message for f in report.findings])
    policy = OfflinePolicy()
    diagnosis = policy.diagnose(DiagnoseInput(generation=1, report=report))
    files = {f: (harness / f).read_text() for f in starting_harness(None, harness).files}
    plan = policy.plan(PlanInput(generation=1, domain=name.split("/")[0], k=2, diagnosis=diagnosis,
                                 findings=report.findings, files=files))
    proposed = [iv.transform for iv in plan.interventions]
    assert proposed[0] == transform, plan.rationale
    if name in SECOND:
        assert SECOND[name][1] in proposed, plan.rationale


@pytest.mark.slow
def test_the_demos_defect_shows_in_a_short_run_and_the_planner_proposes_its_repair_first(warm_math, tmp_path):
    """`make demo`'s harness, trained here: 3 real GRPO steps from the shipped math policy."""
    name = "math/answer_line_everywhere"
    _shows_and_is_repaired(name, _short_run(warm_math, FLAWED / name, tmp_path, steps=3), tmp_path)


@pytest.mark.parametrize("name", sorted(n for n in DEFECTS if n != "math/answer_line_everywhere"))
def test_the_defect_shows_in_recorded_evidence_and_the_planner_proposes_its_repair_first(tmp_path, name):
    """The same on the evidence of a real 5-step run under the harness, recorded (`record_evidence.py`: a training
    child costs a suite about 30 s a harness); evidence of an
    older version of the harness is refused."""
    data = RECORDED / name.replace("/", "-")
    source = json.loads((data / "source.json").read_text())
    assert source["digest"] == starting_harness(None, FLAWED / name).digest, \
        f"{name} changed since its evidence was recorded: run `{source['command']}`"
    _shows_and_is_repaired(name, data / "evidence", tmp_path)


@pytest.mark.parametrize("name, need, size", [("math/pairs", 7, 8), ("code/cold_pairs", 9, 16)])
def test_larger_groups_are_sized_from_the_recorded_evidence(tmp_path, name, need, size):
    """On a real run's evidence, `small_groups` names the group its levels need wherever their rates move within the
    band, and `more_generations` goes to the first size the batch (256) holds whole that reaches it, where the doubling
    gave groups of 4: math/pairs has 63% of its groups on such levels (0.63 x (0.8^7 + 0.2^7) = 13.2%), code/cold_pairs
    90% (groups of 8 could read 0.9 x 16.8% = 15.1%)."""
    from evotrainer.agents.offline.catalog import apply
    from evotrainer.trainer.harness import load_spec

    harness = FLAWED / name
    report = health_report(RECORDED / name.replace("/", "-") / "evidence", harness_dir=harness, work_dir=tmp_path)
    [needed] = [f for f in report.findings if f.metric == "group_size_needed"]
    assert needed.value == need
    files = {f: (harness / f).read_text() for f in starting_harness(None, harness).files}
    out = tmp_path / "sized"
    shutil.copytree(harness, out)
    (out / "harness.yaml").write_text(apply("more_generations", files, report.findings).files["harness.yaml"])
    assert load_spec(out).trainer["num_generations"] == size


def test_a_shipped_policy_is_current_and_copied_into_the_cache_on_first_use(tmp_path, monkeypatch):
    """Every policy the package ships is the warm-up's output for its domain's default configuration (a change of
    configuration, task data or tokenizer that makes a new key makes it stale: this fails until it is shipped
    again); a cache miss copies it, byte for byte, unless EVOTRAINER_NO_SHIPPED asks for a warm-up."""
    import json

    from evotrainer.trainer.policy import SHIPPED, cache_key, cached_policy, default_configs

    shipped = sorted(p for p in SHIPPED.iterdir() if (p / "meta.json").is_file())
    assert [p.name.split("-s")[0] for p in shipped] == ["code", "math", "swe"]
    for path in shipped:
        meta = json.loads((path / "meta.json").read_text())
        assert cache_key(meta["domain"], meta["seed"], *default_configs(meta["domain"])) == path.name
    monkeypatch.setenv("EVOTRAINER_CACHE", str(tmp_path))
    monkeypatch.setenv("EVOTRAINER_NO_SHIPPED", "1")
    assert cached_policy("math", 0, *default_configs("math")) is None
    monkeypatch.delenv("EVOTRAINER_NO_SHIPPED")
    hit = cached_policy("math", 0, *default_configs("math"))
    math = next(p for p in shipped if p.name.startswith("math-"))
    assert hit == tmp_path / "policies" / math.name
    assert (hit / "model.safetensors").read_bytes() == (math / "model.safetensors").read_bytes()
    assert cached_policy("math", 1, *default_configs("math")) is None  # another seed: nothing shipped
