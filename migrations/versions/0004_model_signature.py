"""model signature: models.inputs (named inputs with dynamic axes and dtypes) and models.outputs (output structure)

Revision ID: 0004
Revises: 0003_workers
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003_workers"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Nullable: rows uploaded before this revision keep `input_shape` as their one-input signature.
    with op.batch_alter_table("models", schema=None) as batch_op:
        batch_op.add_column(sa.Column("inputs", sa.JSON(), nullable=True))
        batch_op.add_column(sa.Column("outputs", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("models", schema=None) as batch_op:
        batch_op.drop_column("outputs")
        batch_op.drop_column("inputs")
