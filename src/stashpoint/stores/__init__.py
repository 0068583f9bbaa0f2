"""Metadata backends: one module per kind of store, chosen by URL scheme (see ``registry``)."""
