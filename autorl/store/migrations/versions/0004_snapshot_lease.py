"""one snapshot in progress per experiment: the lease its grader holds while copying"""

import sqlalchemy as sa

from autorl.store.migrations.added_columns import added_columns


revision = '0004_snapshot_lease'
down_revision = '0003_shared_evaluations'

upgrade, downgrade = added_columns(
    experiments=[
        sa.Column('snapshot_holder', sa.String(length=32), nullable=True),
        sa.Column('snapshot_lease_until', sa.DateTime(timezone=True), nullable=True),
    ],
)
