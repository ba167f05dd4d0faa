"""what an agent brought in: registered public checkpoints, test problems found in its files"""

import sqlalchemy as sa

from autorl.store.migrations.added_columns import added_columns


revision = '0012_provenance'
down_revision = '0011_evaluation_cache'

upgrade, downgrade = added_columns(
    experiments=[
        sa.Column('known_checkpoints', sa.JSON(), nullable=True),
        sa.Column('test_overlap', sa.Integer(), nullable=True),
        sa.Column('twin_score', sa.Float(), nullable=True),
        sa.Column('twin_p_value', sa.Float(), nullable=True),
    ],
)
