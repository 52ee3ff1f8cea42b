"""What the API (service/) and the workers (worker/) share: the database and its job state machine (db/), the
artifact store (storage/), the settings, the queue client, the worker registry and the reaper. Neither side
imports the other; both import this (docs/architecture.md, "Import rules")."""
