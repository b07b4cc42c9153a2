"""The base below every part: the one user-facing error, atomic files, process-wide settings.

It imports nothing of EvoTrainer; every other part may import it (docs/architecture.md, "Dependencies").
"""
