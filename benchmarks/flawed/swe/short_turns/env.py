"""The tool environment of this harness (the engine lives in the package: evotrainer.trainer.swe_env).

TOOLS        the actions the policy may take, one per turn: search, view, edit, test, submit, history
MAX_TURNS    actions per episode before it ends unsubmitted
MAX_CONTEXT  tokens of prompt, actions and observations before it ends with "[context full]"
MAX_ACTION_TOKENS  the longest action line

Sealed evaluation ignores this file and uses the domain's own configuration (no `history`).
"""

TOOLS = ["search", "view", "edit", "test", "submit"]
MAX_TURNS = 3
MAX_CONTEXT = 512
MAX_ACTION_TOKENS = 40
