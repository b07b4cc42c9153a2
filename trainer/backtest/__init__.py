"""Backtests (DESIGN §7): evidence that a candidate harness deserves promotion, before it is promoted.

- `replay.py`: the candidate's code on stored rollouts, in an isolated child; every statistic and gate in the
  parent.
- `arms.py`: short runs, candidate against control from the champion's policy (`Bench`: a run as paths and
  commits).
- `statistics.py`: the paired bootstrap, the minimum detectable effect, the sequential rule.
- `results.py`: what a backtest reports (JSON and Markdown).
- `schedule.py`: one candidate (`backtest`) or a generation's (`backtest_all`), replay first, arms side by side.
"""

import importlib

# imported on first use (PEP 562): the replay child runs `python -m evotrainer.trainer.backtest.replay`, which imports
# this package first; importing replay here as well ran the module twice (a RuntimeWarning in every replay's log) and
# made the child import the short-run machinery it never uses
_WHERE = {"BacktestConfig": "evotrainer.base.config", "Bench": "arms", "Harness": "arms", "arm_tag": "arms",
          "Agreement": "replay", "Distribution": "replay", "ReplayResult": "replay", "run_replay": "replay",
          "Arm": "results", "BacktestResult": "results", "ShortRunResult": "results", "backtest": "schedule",
          "backtest_all": "schedule", "train_controls": "schedule", "paired_bootstrap": "statistics"}

__all__ = sorted(_WHERE)


def __getattr__(name: str):
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    where = _WHERE[name]
    return getattr(importlib.import_module(where if "." in where else f"{__name__}.{where}"), name)
