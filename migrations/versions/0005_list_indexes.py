"""list indexes: jobs by project + status or kind in list order, artifacts by job + kind

Revision ID: 0005_list_indexes
Revises: 0004
Create Date: 2026-12-02

`GET /v1/jobs?status=queued&status=running` (and `?kind=`) filtered the project's rows of ix_jobs_list one
by one; the quota's count of a project's active jobs read the same. These put the filter column between
the project and the list order (created_at, id), so a page is an index range. No index on the lease or
`updated_at` columns the reaper filters on: the running jobs it scans are few (ix_jobs_status finds them),
and the heartbeat rewrites those columns every few seconds per job, which PostgreSQL does in place (HOT)
only while no index covers them (docs/scaling.md, "The API").
"""

from __future__ import annotations

from alembic import op

revision = "0005_list_indexes"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.create_index("ix_jobs_list_status", ["project_id", "status", "created_at", "id"], unique=False)
        batch_op.create_index("ix_jobs_list_kind", ["project_id", "kind", "created_at", "id"], unique=False)
    with op.batch_alter_table("artifacts", schema=None) as batch_op:
        batch_op.create_index("ix_artifacts_job_kind", ["job_id", "kind"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("artifacts", schema=None) as batch_op:
        batch_op.drop_index("ix_artifacts_job_kind")
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.drop_index("ix_jobs_list_kind")
        batch_op.drop_index("ix_jobs_list_status")
