"""Domains: task sources and sealed scorers (DESIGN §5). Harness code never imports from here."""

from __future__ import annotations

from evotrainer.errors import UserError
from evotrainer.trainer.domains.base import Domain, Task, fingerprint

DOMAINS = ("math",)


def get_domain(name: str) -> Domain:
    """The domain called `name`, or a UserError listing the known ones."""
    if name == "math":
        from evotrainer.trainer.domains.math import MathDomain

        return MathDomain()
    raise UserError(f"unknown domain {name!r}: choose one of {', '.join(DOMAINS)}")


__all__ = ["DOMAINS", "Domain", "Task", "fingerprint", "get_domain"]
