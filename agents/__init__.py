"""Diagnoser, Planner, Coder, Critic and the offline meta-policy (see the loop issue)."""
