"""Stashpoint's hooks in coding agents' settings files (Claude Code, Codex, Aider): the recipe
each agent gets, and keeping it through a restore of the workspace.

Why here, below the session and every front end: a restore of the workspace rewrites the
agent's settings file, and whatever restores it (a ``stashpoint rewind``, the web UI's rewind
button, a session finishing a restore that a crash interrupted) must merge our entries back the
same way. Nothing here imports click: the CLI adds the command line a hook runs and its own
messages.
"""
