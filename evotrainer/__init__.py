"""EvoTrainer: co-evolve an LLM policy and its RL training harness."""

__version__ = "0.1.0"
