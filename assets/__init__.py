"""Dagster assets, one module per stage; each asset reads config, calls `kiln`, writes through storage."""
