"""what an agent brought in: registered public checkpoints, test problems found in its files

Revision ID: 0012_provenance
Revises: 0011_evaluation_cache
Create Date: 2026-12-06 06:00:00.000000
"""

from alembic import op
import sqlalchemy as sa


revision = '0012_provenance'
down_revision = '0011_evaluation_cache'


def upgrade() -> None:
    with op.batch_alter_table('experiments', schema=None) as batch_op:
        batch_op.add_column(sa.Column('known_checkpoints', sa.JSON(), nullable=True))
        batch_op.add_column(sa.Column('test_overlap', sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column('twin_score', sa.Float(), nullable=True))
        batch_op.add_column(sa.Column('twin_p_value', sa.Float(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('experiments', schema=None) as batch_op:
        batch_op.drop_column('twin_p_value')
        batch_op.drop_column('twin_score')
        batch_op.drop_column('test_overlap')
        batch_op.drop_column('known_checkpoints')
