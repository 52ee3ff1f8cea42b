"""jobs.attempt_started_at: when the current attempt began; started_at stays the first attempt's

Revision ID: 0007_attempt_started_at
Revises: 0006_job_nodes
Create Date: 2026-12-07
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007_attempt_started_at"
down_revision = "0006_job_nodes"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch:  # batch: SQLite cannot ALTER most things in place
        batch.add_column(sa.Column("attempt_started_at", sa.DateTime(timezone=True), nullable=True))
    op.execute("UPDATE jobs SET attempt_started_at = started_at")


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("attempt_started_at")
