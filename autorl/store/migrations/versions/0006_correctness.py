"""each evaluation keeps its per-problem correctness and the digest of the problems it was taken on"""

import sqlalchemy as sa

from autorl.store.migrations.added_columns import added_columns


revision = '0006_correctness'
down_revision = '0004_snapshot_lease'

upgrade, downgrade = added_columns(
    submissions=[
        sa.Column('correctness', sa.Text(), nullable=True),
        sa.Column('problems_digest', sa.String(length=64), nullable=True),
    ],
)
