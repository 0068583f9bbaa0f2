"""Hostile bundles, built small on disk: shared by ``tests/test_bundle_limits.py`` (at sizes a
unit test can afford) and ``tests/hostile/measure.py`` (at the sizes an attacker would use)."""
