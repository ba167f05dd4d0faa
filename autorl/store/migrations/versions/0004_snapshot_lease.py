"""one snapshot in progress per experiment: the lease its grader holds while copying

Revision ID: 0004_snapshot_lease
Revises: 0003_shared_evaluations
Create Date: 2026-12-03 18:00:00.000000
"""

from alembic import op
import sqlalchemy as sa


revision = '0004_snapshot_lease'
down_revision = '0003_shared_evaluations'


def upgrade() -> None:
    with op.batch_alter_table('experiments', schema=None) as batch_op:
        batch_op.add_column(sa.Column('snapshot_holder', sa.String(length=32), nullable=True))
        batch_op.add_column(sa.Column('snapshot_lease_until', sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('experiments', schema=None) as batch_op:
        batch_op.drop_column('snapshot_lease_until')
        batch_op.drop_column('snapshot_holder')
