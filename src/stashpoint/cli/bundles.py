"""Portable bundles: export, import."""

from __future__ import annotations
