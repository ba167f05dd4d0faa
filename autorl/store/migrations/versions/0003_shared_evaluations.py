"""identical submissions in flight share one evaluation; failures keep their reason class"""

import sqlalchemy as sa

from autorl.store.migrations.added_columns import added_columns


revision = '0003_shared_evaluations'
down_revision = '0002_snapshots'

upgrade, downgrade = added_columns(
    submissions=[
        sa.Column('waits_for', sa.Integer(), nullable=True),
        sa.Column(
            'failure_reason',
            sa.Enum('setup', 'evaluation', 'timeout', 'interrupted', 'cancelled', name='failurereason', native_enum=False, length=16),
            nullable=True,
        ),
    ],
)
