"""The Dagster code location: one `Definitions`, jobs, and the demo runner."""
