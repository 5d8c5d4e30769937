"""Adapters that plug dmlgraph into other toolchains (each needs its optional extra installed)."""
