"""Domains: task sources and sealed scorers (DESIGN §5). Harness code never imports from here."""

from __future__ import annotations

from evotrainer.base.errors import UserError
from evotrainer.trainer.domains.base import Domain, Grade, Task, fingerprint, grade_all

DOMAINS = ("math", "code", "swe")


def get_domain(name: str) -> Domain:
    """The domain called `name`, or a UserError listing the known ones."""
    if name == "math":
        from evotrainer.trainer.domains.math import MathDomain

        return MathDomain()
    if name == "code":
        from evotrainer.trainer.domains.code import CodeDomain

        return CodeDomain()
    if name == "swe":
        from evotrainer.trainer.domains.swe import SWEDomain

        return SWEDomain()
    raise UserError(f"unknown domain {name!r}: choose one of {', '.join(DOMAINS)}")


__all__ = ["DOMAINS", "Domain", "Grade", "Task", "fingerprint", "get_domain", "grade_all"]
