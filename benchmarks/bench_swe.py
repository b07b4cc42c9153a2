"""Throughput of the SWE tool environment on this machine: environment steps and episodes per second.

    python benchmarks/bench_swe.py [--episodes 256] [--repeats 3] [--checkpoint DIR]

Three measurements, each the median of `--repeats`:
- environment only: scripted solution episodes (search/view/edit/test/submit), every `test` action run in the
  program sandbox as in training: the cost of the environment itself;
- sealed grading: replaying those episodes' edits and running the hidden tests (what every rollout costs);
- with a policy: greedy episodes of a checkpoint as sealed evaluation plays them, its cache kept between turns
  (default: the cached SWE warm policy, else a fresh untrained model, whose rambling actions are the worst case)
  in the sealed environment, generation included.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

from evotrainer.base.settings import apply_offline_switches


def timed(fn, repeats: int):
    times, out = [], None
    for _ in range(repeats):
        t = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times), out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--episodes", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--checkpoint", default=None, help="policy to play with (default: the cached warm policy)")
    args = ap.parse_args()
    apply_offline_switches()
    import torch

    from evotrainer.trainer import episodes, swe_scripts
    from evotrainer.trainer.domains import get_domain, grade_all
    from evotrainer.trainer.policy import build_model, build_tokenizer, cached_policy, default_configs, load_policy

    torch.set_num_threads(1)
    d = get_domain("swe")
    tasks = d.tasks("train", args.episodes, seed=1)
    tok = build_tokenizer()
    rng = random.Random(0)
    scripts = [swe_scripts.solution_script(t.target, rng, 0.3)[0] for t in tasks]
    rows = [{"prompt": t.prompt, **dict(t.columns)} for t in tasks]
    grade_all(d, ["x"], [tasks[0].answer], ["episode"])  # start the sandbox workers once, as training does

    def scripted():
        return episodes.run_episodes(swe_scripts.script_policy(tok, scripts), tok, rows, d.sft_env)

    sec, outs = timed(scripted, args.repeats)
    steps = sum(len(o.episode.actions) for o in outs)
    print(f"environment only, {len(outs)} scripted episodes ({steps} steps, sandboxed tests): {sec:.2f} s = "
          f"{steps / sec:.0f} env steps/s, {len(outs) / sec:.0f} episodes/s")
    sec, grades = timed(lambda: grade_all(d, [o.text for o in outs], [t.answer for t in tasks],
                                          [t.fmt for t in tasks]), args.repeats)
    print(f"sealed grading of those episodes: {sec:.2f} s = {len(outs) / sec:.0f} episodes/s, "
          f"{sum(g.correct for g in grades)}/{len(grades)} resolved")

    model_cfg, warm_cfg = default_configs("swe")
    path = args.checkpoint or cached_policy("swe", 0, model_cfg, warm_cfg)
    if path:
        model, tok = load_policy(path)
        label = f"policy {path}"
    else:
        model = build_model(model_cfg, tok, 0).eval()
        label = "untrained policy (no cached warm policy: run `evotrainer train --domain swe` once)"
    dev = d.tasks("dev", args.episodes)
    played: list = []

    def play():
        rows = [{"prompt": t.prompt, **dict(t.columns)} for t in dev]
        played[:] = episodes.run_episodes(episodes.model_policy(model, tok, keep_cache=True), tok, rows, d.sealed_env)
        return played

    sec, _ = timed(play, args.repeats)
    steps = sum(len(o.episode.actions) for o in played)
    tokens = sum(sum(o.env_mask) for o in played)
    print(f"{label}: {len(played)} greedy episodes ({steps} steps, {tokens} generated tokens) in {sec:.2f} s = "
          f"{steps / sec:.1f} env steps/s, {len(played) / sec:.1f} episodes/s")


if __name__ == "__main__":
    main()
