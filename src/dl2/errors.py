"""The one exception type that reaches users: its message says what to fix."""


class Dl2Error(Exception):
    """Bad input (file, line, key or value named in the message); the CLI prints it on one line."""
