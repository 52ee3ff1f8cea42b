"""job_nodes: the nodes of an attempt of a job across several machines, and node 0's rendezvous

Revision ID: 0006_job_nodes
Revises: 0005_list_indexes
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006_job_nodes"
down_revision = "0005_list_indexes"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "job_nodes",
        sa.Column("job_id", sa.String(length=36), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("node_rank", sa.Integer(), nullable=False),
        sa.Column("owner", sa.String(length=200), nullable=False),
        sa.Column("address", sa.String(length=200), nullable=True),
        sa.Column("port", sa.Integer(), nullable=True),
        sa.Column("joined_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["job_id"], ["jobs.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("job_id", "attempt", "node_rank"),
    )


def downgrade() -> None:
    op.drop_table("job_nodes")
