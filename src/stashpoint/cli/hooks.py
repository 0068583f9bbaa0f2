"""Hooks for CLI coding agents: hooks install / hooks run."""

from __future__ import annotations
