"""submission snapshots: the snapshot folder and the files not evaluated

Revision ID: 0002_snapshots
Revises: 0001
Create Date: 2026-11-30 10:30:00.000000
"""

from alembic import op
import sqlalchemy as sa


revision = '0002_snapshots'
down_revision = '0001'


def upgrade() -> None:
    with op.batch_alter_table('submissions', schema=None) as batch_op:
        batch_op.add_column(sa.Column('snapshot', sa.String(length=64), nullable=True))
        batch_op.add_column(sa.Column('ignored_files', sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('submissions', schema=None) as batch_op:
        batch_op.drop_column('ignored_files')
        batch_op.drop_column('snapshot')
