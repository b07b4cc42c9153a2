"""The one error a user can meet: a sentence naming the problem and the fix."""


class UserError(Exception):
    """Bad input or environment. The CLI prints the message alone and exits with status 2."""
