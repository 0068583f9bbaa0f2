"""Test helpers importable by third parties (e.g. the metadata-store conformance suite)."""
