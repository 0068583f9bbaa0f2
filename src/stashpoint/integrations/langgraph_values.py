"""Moved to :mod:`stashpoint.langgraph_values` (reading a store needs no integration)."""

from ..langgraph_values import *  # noqa: F403
from ..langgraph_values import __all__ as __all__
