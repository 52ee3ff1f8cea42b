"""Database layer: tables, sessions, the job state machine and migrations."""
