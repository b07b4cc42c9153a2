"""`evotrainer compare`: arm harnesses, step accounting, statistics, bad input, and a one-seed smoke run of the real
command (tiny policy, the `smoke` budget) that resumes instead of recomputing."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import yaml

from evotrainer.base.errors import UserError
from evotrainer.compare import (
    BUDGETS,
    STATIC,
    Cell,
    Comparison,
    check_request,
    line_steps,
    markdown,
    static_harness,
    summarize,
)
from evotrainer.compare.execution import check_start, own_memory
from evotrainer.compare.hpo import current, propose, space, template_recipe, trial_count
from evotrainer.trainer.harness import load_spec
from evotrainer.trainer.policy import weights_digest
from evotrainer.workspaces.source import starting_harness

from .conftest import last_json, run_cli


@pytest.mark.parametrize("domain", ["math", "code"])
def test_static_arms_change_only_their_keys_and_stay_valid(domain, tmp_path):
    from evotrainer.workspaces import TEMPLATES

    template = (TEMPLATES / domain / "harness.yaml").read_text()
    ref = yaml.safe_load(template)
    for arm, keys in STATIC.items():
        path = static_harness(starting_harness(domain), arm, tmp_path / arm)
        text = (path / "harness.yaml").read_text()
        assert text.startswith(f"# evotrainer compare: the {arm} arm")
        assert text.count("#") == template.count("#") + 1  # the template's comments are kept
        spec = yaml.safe_load(text)
        for key, value in keys.items():
            assert spec["trainer"].get(key, spec.get(key)) == yaml.safe_load(str(value)), (arm, key)
        assert all(spec["trainer"][k] == v for k, v in ref["trainer"].items() if k not in keys), arm
        assert all(spec[k] == ref[k] for k in ("rewards", "filters", "group_filters") if k not in keys), arm
        assert load_spec(path).domain == domain
    assert load_spec(tmp_path / "zero_var").group_filters == ["drop_dead_groups"]
    assert load_spec(tmp_path / "dr_grpo").trainer["scale_rewards"] == "none"


def test_line_steps_sum_the_parents_back_to_the_warm_policy(tmp_path):
    warm, a, b = tmp_path / "warm", tmp_path / "a", tmp_path / "b"
    for path, meta in ((warm, {"kind": "warm-policy", "steps": 300}), (a, {"parent": str(warm), "steps": 10}),
                       (b, {"parent": str(a), "steps": 5})):
        path.mkdir()
        (path / "meta.json").write_text(json.dumps(meta))
    assert line_steps(b) == 15 and line_steps(a) == 10 and line_steps(warm) == 0
    assert line_steps(b, since=a) == 5 and line_steps(a, since=a) == 0  # from a trained starting checkpoint


def _cell(arm, seed, correct, promotions=(), lineage=()):
    sampled = [2 * c for c in correct]  # k = 4: two of four samples right where greedy is right
    return Cell(arm=arm, seed=seed, checkpoint="c", main_steps=4, total_steps=8, cpu_seconds=1, wall_seconds=1,
                test_accuracy=sum(correct) / len(correct), test_avg_at_k=sum(sampled) / 4 / len(correct),
                item_ids=[str(i) for i in range(len(correct))], greedy_correct=correct, k=4, sampled_correct=sampled,
                promotions=list(promotions), lineage=list(lineage))


def test_summaries_pair_each_arm_with_the_reference_and_count_invalid_promotions():
    ref = [[True, False, True, False] * 25, [True, True, False, False] * 25]
    better = [[True, True, True, False] * 25, [True, True, True, False] * 25]
    fell = {"measured": True, "invalid": True, "generation": 1, "branch": "cand/g1-x", "test_before": 0.8,
            "test_after": 0.7, "delta": -0.1, "ci": [-0.15, -0.05]}
    lineage = [{"decision": "promote", "failed_gates": [], "mde": 0.02},
               {"decision": "reject", "failed_gates": ["leak_usage"], "mde": None},  # gated at replay: no short run
               {"decision": "reject", "failed_gates": [], "mde": 0.01}]
    cells = [_cell("reference", s, ref[s]) for s in (0, 1)] + \
            [_cell("evotrainer", s, better[s], [fell] if s else [], lineage) for s in (0, 1)] + \
            [_cell("zero_var", s, ref[s]) for s in (0, 1)]
    by = {s.arm: s for s in summarize(cells, ["evotrainer", "reference", "zero_var"])}
    assert by["reference"].vs_reference is None
    assert by["zero_var"].vs_reference == (0.0, 0.0, 0.0)  # the same answers: no difference, no spread
    d, lo, hi = by["evotrainer"].vs_reference
    assert d == pytest.approx(0.25) and 0 < lo < d < hi
    assert by["evotrainer"].test_ci[0] < by["evotrainer"].test_accuracy < by["evotrainer"].test_ci[1]
    # avg@k from the per-item samples, its interval from the same two-level bootstrap (items vary within a seed)
    assert by["evotrainer"].avg_at_k == pytest.approx(0.375)
    assert by["evotrainer"].avg_at_k_ci[0] < 0.375 < by["evotrainer"].avg_at_k_ci[1]
    assert by["evotrainer"].invalid_promotions == 1 and by["evotrainer"].promotions == 1
    assert by["evotrainer"].gate_rejections == 2 and by["zero_var"].gate_rejections == 0  # one per seed
    c = Comparison(domain="math", budget=BUDGETS["smoke"], budget_name="smoke", seeds=[0, 1],
                   arms=["evotrainer", "reference", "zero_var"], start_checkpoint="/w/warm", start_accuracy=0.4,
                   start_avg_at_k=0.3, command="evotrainer compare", wall_seconds=1,
                   summaries=list(by.values()), cells=cells)
    md = markdown(c)
    assert "- evotrainer s1 g1 `cand/g1-x`: 0.800 -> 0.700, -0.100 [-0.150, -0.050] **invalid**" in md
    assert "**EvoTrainer beats the reference at equal main-line steps**" in md and "+0.250" in md
    assert "The starting policy scores 0.400 greedy, 0.300 avg@2" in md
    half = (by["zero_var"].test_ci[1] - by["zero_var"].test_ci[0]) / 2
    assert f"| zero_var | 0.500 ±{half:.3f} [" in md and "| +0.000 [+0.000, +0.000] |" in md
    assert "| evotrainer | 0.750 | 0.750 |" in md  # the per-seed table
    assert "Backtest decisions with a short run: 4; their minimum detectable effect (80% power, 5% level): median " \
           "0.015, range 0.010-0.020." in md
    # the search arm: its choice in words, and EvoTrainer against it on the same seeds and items
    from evotrainer.compare.hpo import Search, Trial

    trials = [Trial(number=0, params={"learning_rate": 1e-4, "beta": 0.0}, dev_accuracy=0.5, checkpoint="t0"),
              Trial(number=1, params={"learning_rate": 2e-4, "beta": 0.0}, dev_accuracy=0.6, checkpoint="t1")]
    hpo = [_cell("hpo", s, ref[s]).model_copy(update={"search": Search(trial_steps=2, trials=trials, chosen=1,
                                                                         startup=2)}) for s in (0, 1)]
    md = markdown(c.model_copy(update={"cells": cells + hpo, "arms": [*c.arms, "hpo"]}))
    assert "- seed 1: 2 trials of 2 steps, dev 0.500-0.600; chose trial 1 (dev 0.600): learning_rate=0.0002" in md
    assert "Against the hyperparameter search (`hpo`, 8 GRPO steps a seed against EvoTrainer's 8): +0.250 [" in md
    even = c.model_copy(update={"summaries": [by["zero_var"].model_copy(update={"arm": "evotrainer"}),
                                              by["reference"]]})
    assert "**EvoTrainer is not distinguishable from the reference" in markdown(even)


def test_a_comparison_may_grow_its_seeds_but_not_change_its_arms(tmp_path):
    request = {"domain": "math", "seeds": 3, "arms": ["evotrainer", "reference"], "budget": "default",
               "checkpoint": None}
    check_request(tmp_path, request)
    check_request(tmp_path, {**request, "seeds": 5})  # more seeds extend the same comparison
    assert json.loads((tmp_path / "request.json").read_text())["seeds"] == 5
    with pytest.raises(UserError, match="other settings"):
        check_request(tmp_path, {**request, "arms": ["reference"]})
    with pytest.raises(UserError, match="other settings"):
        check_request(tmp_path, {**request, "budget": "smoke"})


def test_a_loop_run_starts_from_an_empty_memory_whatever_a_run_before_it_left(tmp_path):
    """A loop cell computed again (its run set aside or removed) would otherwise read the first run's lessons of the
    same transforms on the same seed as its prior: each leftover memory is moved aside, numbered, and kept."""
    skills = tmp_path / "skills" / "evotrainer-s0"
    assert own_memory(skills) == skills and not skills.exists()  # nothing left: nothing moved
    for n in (1, 2):
        skills.mkdir(parents=True)
        (skills / "chroma.sqlite3").write_text(f"run {n}")
        assert own_memory(skills) == skills and not skills.exists()
        assert (tmp_path / "skills" / f"evotrainer-s0.orphan-{n}" / "chroma.sqlite3").read_text() == f"run {n}"


def test_a_comparison_computes_more_cells_only_from_the_weights_its_cells_started_from(tmp_path):
    request = {"domain": "swe", "seeds": 3, "arms": ["evotrainer", "reference"], "budget": "default",
               "checkpoint": None}
    here, there = tmp_path / "here", tmp_path / "there"  # one warm policy's key, built on two machines
    for path, byte in ((here, b"\x01"), (there, b"\x02")):
        path.mkdir()
        (path / "model.safetensors").write_bytes(byte * 4096)
    out = tmp_path / "cmp"
    out.mkdir()
    check_request(out, request)
    check_start(out, here, finished=False)
    recorded = weights_digest(here)
    assert json.loads((out / "request.json").read_text())["start_weights"] == recorded != weights_digest(there)
    check_request(out, {**request, "seeds": 5})  # a resume's request keeps the record
    check_start(out, here, finished=False)
    with pytest.raises(UserError, match=f"computed from start weights {recorded}, but {there} holds"):
        check_start(out, there, finished=False)
    check_start(out, there, finished=True)  # every cell done: only read, its report written again anywhere
    assert json.loads((out / "request.json").read_text())["start_weights"] == recorded
    older = tmp_path / "older"  # recorded before the check: pinned by its first resume that computes
    older.mkdir()
    (older / "request.json").write_text(json.dumps(request))
    check_start(older, there, finished=True)
    assert "start_weights" not in json.loads((older / "request.json").read_text())
    check_start(older, there, finished=False)
    with pytest.raises(UserError, match="computed from start weights"):
        check_start(older, here, finished=False)
    with pytest.raises(UserError, match="holds no weights"):
        weights_digest(tmp_path)


@pytest.mark.parametrize("args,message", [
    (["--domain", "chess"], "compare supports --domain math, code or swe, not 'chess'"),
    (["--arms", "evotrainer,oracle"], "unknown arm 'oracle'"),
    (["--budget", "huge"], "unknown --budget 'huge'"),
    (["--arms", "reference,hpo"], "add evotrainer to --arms"),
    (["--jobs", "0"], "--jobs"),
])
def test_bad_requests_are_one_clear_error_and_write_nothing(args, message, tmp_path):
    out = tmp_path / "cmp"
    res = run_cli("compare", "--out", str(out), "--json", *args)
    assert res.returncode == 2 and message in res.stderr and "Traceback" not in res.stderr
    assert not out.exists() or not any(out.iterdir())


@pytest.mark.parametrize("domain", ["math", "code"])
def test_the_search_starts_from_the_template_and_proposes_the_same_trials_again(domain, tmp_path):
    from evotrainer.compare.arms import recipe_harness
    from evotrainer.compare.hpo import Trial

    template = template_recipe(starting_harness(domain))
    dist = space(template)
    journal: list[Trial] = []
    for n in range(5):
        params = propose(dist, journal, n, 1, 2, template)
        assert all(dist[k]._contains(dist[k].to_internal_repr(v)) for k, v in params.items())
        journal.append(Trial(number=n, params=params, dev_accuracy=[0.3, 0.1, 0.5, 0.2, 0.4][n], checkpoint="-"))
    assert journal[0].params == current(template)  # the practitioner's baseline is trial 0
    assert len({json.dumps(t.params, sort_keys=True) for t in journal}) == 5
    # a rerun (a resumed cell) proposes the same trial from the same journal; another seed searches elsewhere
    assert propose(dist, journal[:3], 3, 1, 2, template) == journal[3].params
    assert propose(dist, journal[:3], 3, 2, 2, template) != journal[3].params
    # every proposal is a harness a person could have written: the template with the knobs set, and valid
    spec = load_spec(recipe_harness(starting_harness(domain), journal[4].params, tmp_path / "t4", "trial 4"))
    assert {k: spec.trainer[k] for k in journal[4].params} == journal[4].params
    from evotrainer.workspaces import TEMPLATES

    assert spec.rewards == load_spec(TEMPLATES / domain).rewards


def test_the_search_spends_at_most_the_loop_arms_steps():
    # trials x trial steps + the chosen trial continued to the main line's length
    assert trial_count(150, 60, 10) == 10 and 10 * 10 + 50 == 150
    assert trial_count(151, 60, 10) == 10 and trial_count(149, 60, 10) == 9
    assert trial_count(20, 60, 10) == 1  # not even two trials: the template alone, continued
    assert trial_count(8, 2, 2) == 4


def test_processes_running_one_comparison_share_its_cells(tmp_path):
    """Two processes given the same command split the cells: one held by the other is skipped, not computed
    twice, and a finished one is read, not recomputed."""
    from filelock import FileLock

    from evotrainer.compare import Compare

    budget = BUDGETS["smoke"].model_copy(update={"k": 0})
    cmp = Compare(tmp_path, starting_harness("math"), [0], ["reference"], budget, "smoke", tmp_path / "warm", "cmd")
    path = cmp.cell_path("reference", 0)
    path.parent.mkdir(parents=True)
    with FileLock(path.with_suffix(".lock")):  # another process is computing it
        assert cmp.locked_cell("reference", 0, 2, wait=False) is None
        assert not path.exists() and not (tmp_path / "static").exists()
    done = Cell(arm="reference", seed=0, checkpoint="/x", main_steps=2, total_steps=2, cpu_seconds=1, wall_seconds=1,
                test_accuracy=0.5, test_avg_at_k=0.5, item_ids=["a"], greedy_correct=[True])
    path.write_text(done.model_dump_json())
    assert cmp.locked_cell("reference", 0, 2, wait=False) == done
    # a seed whose other cell another process holds is left for later, not waited for, so that this process moves
    # on to the next seed's free cells first
    two = Compare(tmp_path, starting_harness("math"), [0], ["reference", "dr_grpo"], budget, "smoke",
                  tmp_path / "warm", "cmd")
    other, cells = two.cell_path("dr_grpo", 0), {}
    with FileLock(other.with_suffix(".lock")):
        two._pass(cells)
        assert list(cells) == [("reference", 0)]
    other.write_text(done.model_copy(update={"arm": "dr_grpo"}).model_dump_json())
    two._pass(cells)
    assert [c.arm for c in cells.values()] == ["reference", "dr_grpo"]


def test_a_process_computes_every_free_cell_before_it_waits_for_a_held_one(tmp_path, monkeypatch):
    """Another process computes a seed's EvoTrainer cell, then takes its reference cell: this process, which found
    the seed held on its first pass, computes the seed's free `hpo` cell meanwhile instead of waiting, idle, on the
    held reference (as it did: one core unused for half an hour of a benchmark), then waits for it and returns the
    seed's cells in order, the other process's read from their files."""
    import threading

    from filelock import FileLock

    from evotrainer.compare import Compare, execution

    monkeypatch.setattr(execution, "POLL_S", 0.05)
    budget = BUDGETS["smoke"].model_copy(update={"k": 0})
    cmp = Compare(tmp_path, starting_harness("math"), [0], ["evotrainer", "reference", "hpo"], budget, "smoke",
                  tmp_path / "warm", "cmd")
    computed: list[str] = []

    def finished(arm: str) -> Cell:
        c = Cell(arm=arm, seed=0, checkpoint="/x", main_steps=2, total_steps=4, cpu_seconds=1, wall_seconds=1,
                 test_accuracy=0.5, test_avg_at_k=0.5, item_ids=["a"], greedy_correct=[True])
        cmp.cell_path(arm, 0).write_text(c.model_dump_json())
        return c

    def cell(arm, seed, main_steps, total_steps=None):  # as `Compare.cell`: one on file is read, else computed
        if cmp.cell_path(arm, seed).is_file():
            return Cell.model_validate_json(cmp.cell_path(arm, seed).read_text())
        computed.append(arm)
        return finished(arm)

    monkeypatch.setattr(cmp, "cell", cell)
    cmp.cell_path("evotrainer", 0).parent.mkdir(parents=True)
    evo, ref = (FileLock(cmp.cell_path(a, 0).with_suffix(".lock")) for a in ("evotrainer", "reference"))
    out: list = []
    worker = threading.Thread(target=lambda: out.append(cmp.cells()), daemon=True)
    with evo:  # the other process computes the EvoTrainer cell
        worker.start()
        time.sleep(0.3)
        assert computed == []  # nothing of the seed can be computed before its EvoTrainer cell
        finished("evotrainer")
        ref.acquire()  # and goes on to the reference cell
    deadline = time.time() + 10
    while not computed and time.time() < deadline:
        time.sleep(0.05)
    assert computed == ["hpo"] and worker.is_alive()  # the free cell done, the held one awaited
    finished("reference")
    ref.release()
    worker.join(timeout=10)
    assert [c.arm for c in out[0]] == ["evotrainer", "reference", "hpo"] and computed == ["hpo"]


def test_the_long_cells_come_first_and_the_comparison_keeps_its_order(tmp_path, monkeypatch):
    """Every seed's EvoTrainer cell, then the search's, the static recipes' last (so that processes sharing the
    cells end together); the cells come back seed by seed, EvoTrainer's first, then the arms as given."""
    from evotrainer.compare import Compare

    budget = BUDGETS["smoke"].model_copy(update={"k": 0})
    cmp = Compare(tmp_path, starting_harness("math"), [0, 1, 2], ["reference", "evotrainer", "hpo"], budget, "smoke",
                  tmp_path / "warm", "cmd")
    computed: list[tuple[str, int, int]] = []

    def cell(arm, seed, main_steps, total_steps=None):
        computed.append((arm, seed, main_steps))
        return Cell(arm=arm, seed=seed, checkpoint="/x", main_steps=main_steps or 4 + seed, total_steps=8,
                    cpu_seconds=1, wall_seconds=1, test_accuracy=0.5, test_avg_at_k=0.5, item_ids=["a"],
                    greedy_correct=[True])

    monkeypatch.setattr(cmp, "cell", cell)
    cmp.cell_path("evotrainer", 0).parent.mkdir(parents=True)
    cells = cmp.cells()
    assert [(a, s) for a, s, _ in computed] == [(a, s) for a in ("evotrainer", "hpo", "reference") for s in (0, 1, 2)]
    assert all(m == 4 + s for a, s, m in computed if a != "evotrainer")  # each matched to its seed's EvoTrainer cell
    assert [(c.arm, c.seed) for c in cells] == [(a, s) for s in (0, 1, 2) for a in ("evotrainer", "reference", "hpo")]


def test_a_cell_that_no_longer_fits_its_evotrainer_cell_is_stale(tmp_path):
    """A static cell trains the EvoTrainer cell's main-line steps and the search spends its total: once the EvoTrainer
    cell was computed again with other steps, the cells matched to the old one are stale (the smoke comparison
    below shows one set aside and computed again); set_aside never overwrites."""
    from evotrainer.base.files import set_aside
    from evotrainer.compare import Compare
    from evotrainer.compare.hpo import Search, Trial

    budget = BUDGETS["smoke"].model_copy(update={"k": 0})
    cmp = Compare(tmp_path, starting_harness("math"), [0], ["evotrainer", "reference", "hpo"], budget, "smoke",
                  tmp_path / "warm", "cmd")
    ref = Cell(arm="reference", seed=0, checkpoint="/x", main_steps=4, total_steps=4, cpu_seconds=1, wall_seconds=1,
               test_accuracy=0.5, test_avg_at_k=0.5, item_ids=["a"], greedy_correct=[True])
    assert cmp._stale(ref, 4, 9) == ""
    assert cmp._stale(ref, 6, 9) == "trained 4 main-line steps, EvoTrainer's line now has 6"
    assert cmp._stale(ref.model_copy(update={"arm": "evotrainer"}), 6, None) == ""  # a loop cell sets the steps
    ts = cmp.trial_steps(4)
    n = trial_count(12, 4, ts)
    trials = [Trial(number=i, params={}, dev_accuracy=0.5, checkpoint="/t") for i in range(n)]
    hpo = ref.model_copy(update={"arm": "hpo", "search": Search(trial_steps=ts, trials=trials, chosen=0, startup=2)})
    assert cmp._stale(hpo, 4, 12) == ""
    more = trial_count(12 + 3 * ts, 4, ts)
    assert cmp._stale(hpo, 4, 12 + 3 * ts) == f"ran {n} trials, EvoTrainer's steps now pay for {more}"
    (tmp_path / "a.json").write_text("1")
    (tmp_path / "a.stale.json").write_text("2")
    assert set_aside(tmp_path / "a.json", tmp_path / "a.stale.json") == tmp_path / "a.stale-2.json"
    (tmp_path / "d").mkdir()
    assert set_aside(tmp_path / "d", tmp_path / "d") == tmp_path / "d-2"


def _files(*roots: Path) -> dict[Path, int]:
    """Every file under `roots` with its modification time: a training or an evaluation adds or rewrites some."""
    return {p: p.stat().st_mtime_ns for root in roots for p in root.rglob("*") if p.is_file()}


@pytest.mark.slow
def test_smoke_comparison_matches_steps_reports_and_resumes(tiny_policy, scripted_llm, tmp_path):
    out = tmp_path / "cmp"
    arms = "reference,evotrainer,replay_only,hpo,evotrainer_llm"
    args = ["compare", "--domain", "math", "--seeds", "1", "--budget", "smoke", "--arms", arms,
            "--meta-llm", "openai/scripted-meta", "--api-base", scripted_llm,
            "--checkpoint", str(tiny_policy), "--out", str(out), "--json"]
    left = out / "skills" / "evotrainer-s0"  # the memory of a run set aside (`repair.py --again`): never read
    left.mkdir(parents=True)
    (left / "lesson").write_text("a measurement of the first run")
    res = run_cli(*args, "--jobs", "2")  # a second process shares the cells
    assert res.returncode == 0, res.stderr[-2000:]
    assert (out / "skills" / "evotrainer-s0.orphan-1" / "lesson").is_file() and not (left / "lesson").exists()
    summaries = {s["arm"]: s for s in json.loads(res.stdout.strip().splitlines()[-1])}
    worker = (out / "logs" / "worker-1.log").read_text()
    (printed,) = [line for line in worker.splitlines() if line.startswith("[")]  # its summaries, as --json prints
    assert json.loads(printed) == json.loads(res.stdout.strip().splitlines()[-1])
    assert list(summaries) == ["evotrainer", "reference", "hpo", "replay_only", "evotrainer_llm"]  # EvoTrainer first
    # the meta-LLM arm: the same loop, its agents the model the request names (recorded, so a resume cannot change it)
    assert json.loads((out / "request.json").read_text())["meta_llm"] == "openai/scripted-meta"
    llm_run = out / "runs" / "evotrainer_llm-s0"
    start = json.loads((llm_run / "events.jsonl").read_text().splitlines()[0])
    assert start["meta_policy"] == "meta-LLM openai/scripted-meta"
    assert (llm_run / "transcripts" / "planner.jsonl").is_file()
    report = json.loads((out / "compare.json").read_text())
    cells = {c["arm"]: c for c in report["cells"]}
    evo, ref, replay, hpo = cells["evotrainer"], cells["reference"], cells["replay_only"], cells["hpo"]
    # the reference trains exactly as many steps as the EvoTrainer champion line, which includes a promoted arm's
    assert ref["main_steps"] == evo["main_steps"] == ref["total_steps"] >= 2
    assert evo["total_steps"] > evo["main_steps"]  # the short runs' arms are compute the champion line did not keep
    assert replay["total_steps"] == replay["main_steps"] == 2  # no short runs: only the champion's own steps
    # the search: the template's recipe first, as many trials as the EvoTrainer arm's steps pay for, the best on dev
    # chosen and trained to the same main line
    search = hpo["search"]
    trials = search["trials"]
    assert trials[0]["params"] == current(template_recipe(starting_harness("math"))) and len(trials) >= 2
    assert len(trials) == trial_count(evo["total_steps"], evo["main_steps"], search["trial_steps"])
    assert hpo["main_steps"] == evo["main_steps"] and hpo["total_steps"] <= evo["total_steps"]
    best = max(trials, key=lambda t: (t["dev_accuracy"], -t["number"]))
    assert search["chosen"] == best["number"]
    assert len(evo["lineage"]) == 1 and evo["lineage"][0]["decision"] in ("promote", "reject", "inconclusive", "revise")
    assert all(len(c["greedy_correct"]) == 60 for c in cells.values()) and evo["cpu_seconds"] > 0
    for p in evo["promotions"]:  # against the control arm of the same start, seed and steps
        assert p["measured"] and p["invalid"] == (p["ci"][1] < 0) and p["against"] == "control"
        assert line_steps(Path(p["after"])) == line_steps(Path(p["before"]))
    assert summaries["evotrainer"]["vs_reference"] is not None
    md = (out / "results.md").read_text()
    assert "| evotrainer |" in md and "| reference |" in md and "--jobs 2" in md  # the command as the user gave it
    for loop in ("evotrainer", "replay_only"):  # each loop run's own page, written when it finished, named
        assert (out / "runs" / f"{loop}-s0" / "reports" / "report.html").is_file()
        assert f"`runs/{loop}-s0/reports/report.html`" in md
    assert "the reference at equal main-line steps**" in md and "The starting policy scores" in md
    assert report["start_accuracy"] is not None
    for png in ("accuracy_vs_compute.png", "lineage.png"):
        assert (out / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert len(ref["sampled_correct"]) == 60 and ref["k"] == 2
    # the same command again: every cell is on disk, nothing trains again; a cell written before per-item samples
    # were kept is completed from the evaluation cached beside its checkpoint
    old = out / "cells" / "reference-s0.json"
    old.write_text(json.dumps({k: v for k, v in ref.items() if k not in ("k", "sampled_correct")}))
    # and a loop cell whose promotions were measured before they named what they were measured against
    older = out / "cells" / "evotrainer-s0.json"
    older.write_text(json.dumps({**evo, "promotions": [{k: v for k, v in p.items() if k != "against"}
                                                       for p in evo["promotions"]]}))
    trained = _files(out / "runs", out / "static", out / "hpo")  # checkpoints, evidence, logs, evaluation caches
    again = run_cli(*args)
    assert again.returncode == 0 and _files(out / "runs", out / "static", out / "hpo") == trained
    assert last_json(again.stdout) == last_json(res.stdout)
    assert json.loads(old.read_text())["sampled_correct"] == ref["sampled_correct"]
    assert json.loads(older.read_text())["promotions"] == evo["promotions"]
    # a static cell matched to an EvoTrainer cell that has since changed its steps: set aside and computed again
    # (here from the checkpoint of the right length already on disk: its training is not redone)
    old.write_text(json.dumps({**ref, "main_steps": ref["main_steps"] + 2, "total_steps": ref["main_steps"] + 2}))
    third = run_cli(*args)
    assert third.returncode == 0 and _files(out / "static") == {p: t for p, t in trained.items()
                                                                  if p.is_relative_to(out / "static")}
    assert json.loads((out / "cells" / "reference-s0.stale.json").read_text())["main_steps"] == ref["main_steps"] + 2
    again_ref = json.loads(old.read_text())
    assert (again_ref["main_steps"], again_ref["greedy_correct"]) == (ref["main_steps"], ref["greedy_correct"])
    other = run_cli(*[a if a != arms else "reference" for a in args])
    assert other.returncode == 2 and "holds a comparison with other settings" in other.stderr
    # the weights every arm started from are recorded: a cell left to compute from other weights is refused
    request = json.loads((out / "request.json").read_text())
    assert request["start_weights"] == weights_digest(tiny_policy)
    (out / "request.json").write_text(json.dumps({**request, "start_weights": "0" * 16}))
    old.unlink()
    elsewhere = run_cli(*args)
    assert elsewhere.returncode == 2 and "computed from start weights 0000000000000000" in elsewhere.stderr
    assert not old.exists()


def test_a_budget_fixes_only_the_loop_settings_it_names():
    from evotrainer.base.config import loop_config

    assert BUDGETS["default"].loop_overrides() == {"train_steps": 20, "backtest": {"steps": 20, "seeds": 1,
                                                                                  "max_seeds": 1, "dev_items": 2000}}
    default = loop_config("math", BUDGETS["default"].loop_overrides())
    assert BUDGETS["default"].generations * default.train_steps >= 60  # a horizon where changes compound
    assert default.backtest.steps == default.train_steps  # the control's seed-0 arm is the next segment
    smoke = BUDGETS["smoke"].loop_overrides()
    assert smoke == {"train_steps": 2, "backtest": {"steps": 2, "seeds": 1, "max_seeds": 1, "dev_items": 40}}
    # the main line a static arm matches when no EvoTrainer arm runs: the domain's loop defaults, then the budget's
    assert loop_config("math").train_steps == 10 and loop_config("swe").train_steps == 12
    assert loop_config("swe", smoke).train_steps == 2 and loop_config("swe", smoke).backtest.steps == 2
    # a domain default the override leaves alone, section by section
    assert loop_config("swe", {"backtest": {"seeds": 3}}).backtest.dev_items == 200
    # an SWE comparison's sealed test plays one sampled episode per item besides the greedy one, never more
    from evotrainer.compare.arms import budget_for

    assert budget_for("default", "swe").k == 1 and budget_for("default", "math") == BUDGETS["default"]
    assert budget_for("smoke", "swe").k == 1 and budget_for("smoke", "swe").generations == 1
    assert BUDGETS["default"].k == 4  # the table itself is left as it was


def test_a_repair_is_judged_against_its_start_and_a_plain_promotion_against_the_control(tmp_path):
    """compare's invalid-promotion count applies the Critic's rule to the sealed test: a promotion is invalid when
    the policy it hands on is shown worse than what it replaced. A repair of a gate the champion failed replaced a
    control whose harness is invalid, so it is measured against the policy both arms started from, its cost against
    the control kept beside. Worst cases: a repair shown worse than the leaky control but not than its start (valid);
    a repair shown worse than its start and the control (invalid), one worse than its start but better than a control
    that fell (valid); a plain promotion shown worse than the control (invalid). The policies' sealed scores are
    given (`_test`), so each case is exact."""
    from types import SimpleNamespace

    from evotrainer.agents.schemas import VerdictRecord
    from evotrainer.compare import BUDGETS
    from evotrainer.compare.execution import Compare
    from evotrainer.graph.state import GenerationRecord
    from evotrainer.workspaces.run import RunWorkspace

    ws = RunWorkspace.create(tmp_path / "run", "swe")
    policies = {}

    def policy(path: Path, correct: list[int], **meta) -> Path:
        path.mkdir(parents=True)
        (path / "config.json").write_text("{}")
        if meta:
            (path / "meta.json").write_text(json.dumps(meta))
        policies[path.resolve()] = SimpleNamespace(greedy_correct=correct, accuracy=sum(correct) / len(correct))
        return path

    class Scored(Compare):
        def _test(self, checkpoint, seed, work, k=None):
            return policies[Path(checkpoint).resolve()]

    cmp = Scored(tmp_path / "cmp", starting_harness("swe"), [0], ["evotrainer"], BUDGETS["smoke"], "smoke",
                 tmp_path / "warm", "compare")
    measured = []
    start = policy(ws.path / "checkpoints" / "g0" / "policy", [1] * 140 + [0] * 60)  # 0.70
    rose, fell = [1] * 180 + [0] * 20, [1] * 80 + [0] * 120  # the leaky control rose to 0.90, or fell to 0.40
    cases = {"repair-even": ([1] * 140 + [0] * 60, ["leak_usage"], rose, False),  # -0.20 vs control, 0 vs start
             "repair-lost": ([1] * 100 + [0] * 100, ["leak_usage"], rose, True),  # -0.20 vs start, -0.40 vs control
             "repair-ahead": ([1] * 100 + [0] * 100, ["leak_usage"], fell, False),  # -0.20 vs start, +0.10 vs control
             "plain-lost": ([1] * 140 + [0] * 60, [], rose, True)}  # a plain promotion measured against the control
    for g, (name, (correct, repairs, control, invalid)) in enumerate(cases.items(), start=1):
        arm = "s0-k20"
        policy(ws.path / "backtests" / f"g{g}" / "control" / f"c-{arm}" / "checkpoints" / "policy", control,
               parent=str(start), steps=20)
        after = policy(ws.path / "backtests" / f"g{g}" / name / f"x-{arm}" / "checkpoints" / "policy", correct,
                       parent=str(start), steps=20)
        branch = f"cand/g{g}-{name}"
        ws.verdict_path(branch).parent.mkdir(parents=True, exist_ok=True)
        ws.verdict_path(branch).write_text(VerdictRecord(branch=branch, decision="promote", repairs=repairs,
                                                         generation=g).model_dump_json())
        h = GenerationRecord(generation=g, champion_commit="c" * 40, checkpoint=str(after), promoted=branch,
                             trained=str(ws.path / "checkpoints" / f"g{g}-train" / "checkpoints" / "policy"))
        p = cmp._promotion(ws, h, 0)
        assert p["measured"] and p["invalid"] == invalid, (name, p)
        if repairs:
            assert p["against"] == "start" and p["before"] == str(start) and p["repairs"] == repairs
            assert p["vs_control"]["delta"] == pytest.approx((sum(correct) - sum(control)) / 200)
            assert p["invalid"] == (p["ci"][1] < 0 and p["vs_control"]["ci"][1] < 0)
        else:
            assert p["against"] == "control" and p["delta"] == pytest.approx(-0.2) and "vs_control" not in p
        measured.append(p)
    # the report says what a repair was measured against, and what it cost against the control
    cells = [_cell("evotrainer", 0, [1, 0], promotions=measured), _cell("reference", 0, [1, 0])]
    c = Comparison(domain="swe", budget=BUDGETS["smoke"], budget_name="smoke", seeds=[0],
                   arms=["evotrainer", "reference"], start_checkpoint="/w/warm", start_accuracy=0.7,
                   start_avg_at_k=0.7, command="evotrainer compare", wall_seconds=1,
                   summaries=summarize(cells, ["evotrainer", "reference"]), cells=cells)
    md = markdown(c)
    assert "`cand/g1-repair-even`: repairs leak_usage; against its start 0.700 -> 0.700, +0.000 [+0.000, +0.000]; " \
           "against the control 0.900: -0.200 [" in md
    assert "`cand/g2-repair-lost`: repairs leak_usage; against its start 0.700 -> 0.500, -0.200 [" in md
    assert "`cand/g3-repair-ahead`: repairs leak_usage; against its start 0.700 -> 0.500, -0.200 [" in md
    assert c.summaries[0].invalid_promotions == 2  # repair-lost and plain-lost
