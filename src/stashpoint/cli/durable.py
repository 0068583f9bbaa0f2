"""Durable-execution commands: tasks, resume, approve, reject."""

from __future__ import annotations
