"""Policy factory, GRPO backend, evidence store, sealed evaluation, domains."""
