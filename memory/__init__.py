"""Skill memory: distilled lessons in a Chroma store (see the skill-memory issue)."""
