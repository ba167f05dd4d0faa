"""identical submissions in flight share one evaluation; failures keep their reason class

Revision ID: 0003_shared_evaluations
Revises: 0002_snapshots
Create Date: 2026-11-30 13:20:00.000000
"""

from alembic import op
import sqlalchemy as sa


revision = '0003_shared_evaluations'
down_revision = '0002_snapshots'


def upgrade() -> None:
    with op.batch_alter_table('submissions', schema=None) as batch_op:
        batch_op.add_column(sa.Column('waits_for', sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column(
            'failure_reason',
            sa.Enum('setup', 'evaluation', 'timeout', 'interrupted', 'cancelled', name='failurereason', native_enum=False, length=16),
            nullable=True,
        ))


def downgrade() -> None:
    with op.batch_alter_table('submissions', schema=None) as batch_op:
        batch_op.drop_column('failure_reason')
        batch_op.drop_column('waits_for')
