"""The watch daemon's thin side: how a command finds a running daemon and talks to it.

The daemon itself (which imports the whole library) is :mod:`stashpoint.watch_daemon`;
this package imports nothing of stashpoint's, so that a command the daemon serves starts in
milliseconds: the ``stashpoint`` entry point asks here first and imports the CLI only when
no daemon answers.
"""
