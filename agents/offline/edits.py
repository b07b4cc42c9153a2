"""Comment-preserving edits of `harness.yaml` text, the way a careful engineer edits it by hand.

A PyYAML round trip would drop every comment that explains the recipe, and ruamel.yaml's round trip, which keeps
them, still rewrites more than the edit: it drops or moves the blank line after an edited last item, turns `[]`
into a block list, and re-indents a whole file whose layout differs from its one configured indentation (see
docs/architecture.md). These functions change one value (or add one line) and leave the rest of the file byte
for byte. Each returns the new text and raises `EditError` when the file is not laid out as expected, so a
transform never writes a half-edited harness.
"""

from __future__ import annotations

import re

import yaml


class EditError(ValueError):
    """The harness text does not have the shape this edit needs."""


def _block(text: str, key: str) -> tuple[int, int]:
    """Start and end offsets of a top-level block `key:` (its indented body included)."""
    m = re.search(rf"^{re.escape(key)}:[^\n]*\n?", text, flags=re.M)
    if not m:
        raise EditError(f"harness.yaml has no top-level {key!r}")
    end = m.end()
    for line in text[m.end():].splitlines(keepends=True):
        if line.strip() and not line[0].isspace() and not line.lstrip().startswith("#"):
            break
        end += len(line)
    return m.start(), end


def _format(value) -> str:
    if isinstance(value, float):
        return f"{value:.6g}" if abs(value) >= 1e-3 or value == 0 else f"{value:.2e}"
    return yaml.safe_dump(value, default_flow_style=True).strip().removesuffix("...").strip()


def set_knob(text: str, key: str, value, comment: str | None = None) -> str:
    """Set `trainer.<key>` to `value`; add the line when the key is absent. The line's comment is kept, or
    replaced by `comment` when one is given (an old comment explaining the old value would mislead)."""
    start, end = _block(text, "trainer")
    body = text[start:end]
    pat = re.compile(rf"^(\s+{re.escape(key)}:[ \t]*)([^#\n]*?)([ \t]*#[^\n]*)?$", flags=re.M)
    if pat.search(body):
        note = (lambda m: f"  # {comment}") if comment else (lambda m: m.group(3) or "")
        body = pat.sub(lambda m: m.group(1) + _format(value) + note(m), body, count=1)
    else:
        first = body.index("\n") + 1
        note = f"  # {comment}" if comment else ""
        body = body[:first] + f"  {key}: {_format(value)}{note}\n" + body[first:]
    return text[:start] + body + text[end:]


def set_list(text: str, key: str, items: list[str]) -> str:
    """Set a top-level flow list (`filters: [a, b]`), keeping the comment after it."""
    pat = re.compile(rf"^({re.escape(key)}:[ \t]*)(\[[^\]\n]*\])([^\n]*)$", flags=re.M)
    if not pat.search(text):
        raise EditError(f"harness.yaml's {key!r} is not a one-line [list]")
    return pat.sub(lambda m: m.group(1) + "[" + ", ".join(items) + "]" + m.group(3), text, count=1)


def set_reward_weight(text: str, name: str, weight: float) -> str:
    start, end = _block(text, "rewards")
    body = text[start:end]
    pat = re.compile(rf"(-[ \t]+name:[ \t]*{re.escape(name)}\b[^\n]*\n[ \t]+weight:[ \t]*)([-0-9.eE+]+)")
    if not pat.search(body):
        raise EditError(f"harness.yaml has no reward {name!r} with a weight line")
    return text[:start] + pat.sub(lambda m: m.group(1) + _format(float(weight)), body, count=1) + text[end:]


def add_reward(text: str, name: str, weight: float, comment: str = "") -> str:
    start, end = _block(text, "rewards")
    body = text[start:end].rstrip("\n") + "\n"
    note = f"  # {comment}" if comment else ""
    body += f"  - name: {name}{note}\n    weight: {_format(float(weight))}\n"
    return text[:start] + body + "\n" + text[end:].lstrip("\n")


def rename_reward(text: str, name: str, new: str) -> str:
    """Put the reward function `new` in the place of `name`: same weight, same line, its comment kept."""
    start, end = _block(text, "rewards")
    body = text[start:end]
    pat = re.compile(rf"^([ \t]*-[ \t]+name:[ \t]*){re.escape(name)}\b", flags=re.M)
    if not pat.search(body):
        raise EditError(f"harness.yaml has no reward {name!r}")
    return text[:start] + pat.sub(lambda m: m.group(1) + new, body, count=1) + text[end:]


def remove_reward(text: str, name: str) -> str:
    start, end = _block(text, "rewards")
    body = text[start:end]
    # the item's first line, then its indented continuation lines (up to the next "- " item)
    pat = re.compile(rf"^[ \t]*-[ \t]+name:[ \t]*{re.escape(name)}\b[^\n]*\n(?:[ \t]+(?=[^ \t\n-])[^\n]*\n)*",
                     flags=re.M)
    if not pat.search(body):
        raise EditError(f"harness.yaml has no reward {name!r}")
    return text[:start] + pat.sub("", body, count=1) + text[end:]


def set_threshold(text: str, analyzer_id: str, values: dict[str, float]) -> str:
    """Set `analyzers.<id>` to a flow mapping of thresholds (the whole mapping), adding the line if absent."""
    start, end = _block(text, "analyzers")
    body = text[start:end]
    flow = "{" + ", ".join(f"{k}: {_format(float(v))}" for k, v in values.items()) + "}"
    pat = re.compile(rf"^([ \t]+{re.escape(analyzer_id)}:[ \t]*)(\{{[^}}\n]*\}})([^\n]*)$", flags=re.M)
    if pat.search(body):
        body = pat.sub(lambda m: m.group(1) + flow + m.group(3), body, count=1)
    else:
        body = body.rstrip("\n") + f"\n  {analyzer_id}: {flow}\n"
    return text[:start] + body + text[end:]
