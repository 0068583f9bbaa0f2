"""Adapters for agent frameworks, each behind its own optional extra.

    stashpoint.integrations.openai_agents   pip install 'stashpoint[openai-agents]'
    stashpoint.integrations.pydantic_ai     pip install 'stashpoint[pydantic-ai]'
    stashpoint.integrations.langgraph       pip install 'stashpoint[langgraph]'

Nothing here is imported by ``import stashpoint``: a framework is loaded only by the adapter
module that needs it, and a missing one fails on import with the install line to run.
"""

from __future__ import annotations

import importlib
from types import ModuleType

from ..errors import (
    MissingExtraError,
)

__all__ = ["MissingExtraError", "require"]


def require(module: str, extra: str) -> ModuleType:
    """Import ``module`` or raise :class:`MissingExtraError` naming ``extra``."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise MissingExtraError(
            f"this integration needs the {module!r} package: pip install 'stashpoint[{extra}]'"
        ) from exc
