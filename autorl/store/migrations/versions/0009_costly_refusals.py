"""submits refused after the grader began reading the checkpoint's weights count against the limit

Revision ID: 0009_costly_refusals
Revises: 0008_feedback_modes
Create Date: 2026-12-05 09:00:00.000000
"""

from alembic import op
import sqlalchemy as sa


revision = '0009_costly_refusals'
down_revision = '0008_feedback_modes'


def upgrade() -> None:
    with op.batch_alter_table('experiments', schema=None) as batch_op:
        batch_op.add_column(sa.Column('costly_refusals', sa.Integer(), nullable=False, server_default='0'))


def downgrade() -> None:
    with op.batch_alter_table('experiments', schema=None) as batch_op:
        batch_op.drop_column('costly_refusals')
