"""submits refused after the grader began reading the checkpoint's weights count against the limit"""

import sqlalchemy as sa

from autorl.store.migrations.added_columns import added_columns


revision = '0009_costly_refusals'
down_revision = '0008_feedback_modes'

upgrade, downgrade = added_columns(
    experiments=[sa.Column('costly_refusals', sa.Integer(), nullable=False, server_default='0')],
)
