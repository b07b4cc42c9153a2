"""Backtests (DESIGN §7): evidence that a candidate harness deserves promotion, before it is promoted.

- `replay.py`: the candidate's code on stored rollouts, in an isolated child; every statistic and gate in the
  parent.
- `arms.py`: short runs, candidate against control from the champion's policy (`Bench`: a run as paths and
  commits).
- `statistics.py`: the paired bootstrap, the minimum detectable effect, the sequential rule.
- `results.py`: what a backtest reports (JSON and Markdown).
- `schedule.py`: one candidate (`backtest`) or a generation's (`backtest_all`), replay first, arms side by side.
"""

from evotrainer.base.config import BacktestConfig
from evotrainer.trainer.backtest.arms import Bench, Harness, arm_tag
from evotrainer.trainer.backtest.replay import Agreement, Distribution, ReplayResult, run_replay
from evotrainer.trainer.backtest.results import Arm, BacktestResult, ShortRunResult
from evotrainer.trainer.backtest.schedule import backtest, backtest_all, train_controls
from evotrainer.trainer.backtest.statistics import paired_bootstrap

__all__ = ["Agreement", "Arm", "BacktestResult", "Bench", "Distribution", "Harness", "ReplayResult", "BacktestConfig",
           "ShortRunResult", "arm_tag", "backtest", "backtest_all", "paired_bootstrap", "run_replay", "train_controls"]
