"""What people read: ``analyze`` runs the same pipeline over logs and events files afterwards,
``report`` renders its tables, ``history`` its OpenMetrics backfill, ``plots`` its figures; ``top``
is the table of a running exporter's conversations."""
