"""each evaluation keeps its per-problem correctness and the digest of the problems it was taken on

Revision ID: 0006_correctness
Revises: 0004_snapshot_lease
Create Date: 2026-12-03 21:05:00.000000
"""

from alembic import op
import sqlalchemy as sa


revision = '0006_correctness'
down_revision = '0004_snapshot_lease'


def upgrade() -> None:
    with op.batch_alter_table('submissions', schema=None) as batch_op:
        batch_op.add_column(sa.Column('correctness', sa.Text(), nullable=True))
        batch_op.add_column(sa.Column('problems_digest', sa.String(length=64), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('submissions', schema=None) as batch_op:
        batch_op.drop_column('problems_digest')
        batch_op.drop_column('correctness')
