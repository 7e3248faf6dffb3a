"""Afterwards, over files: ``analyze`` runs the same pipeline over logs and events files,
``report`` renders its tables, ``history`` its OpenMetrics backfill, ``plots`` its figures."""
