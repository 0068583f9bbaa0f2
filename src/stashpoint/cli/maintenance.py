"""Store upkeep: prune, gc, du."""

from __future__ import annotations
