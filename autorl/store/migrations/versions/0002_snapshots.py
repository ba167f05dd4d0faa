"""submission snapshots: the snapshot folder and the files not evaluated"""

import sqlalchemy as sa

from autorl.store.migrations.added_columns import added_columns


revision = '0002_snapshots'
down_revision = '0001'

upgrade, downgrade = added_columns(
    submissions=[
        sa.Column('snapshot', sa.String(length=64), nullable=True),
        sa.Column('ignored_files', sa.JSON(), nullable=True),
    ],
)
