"""What people read: ``analyze`` runs the same pipeline over logs and events files afterwards,
``report`` renders its tables, ``history`` its OpenMetrics backfill, ``plots`` its figures.
Commands that talk to running processes are in live/."""
