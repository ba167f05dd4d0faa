"""feedback modes: an experiment's feedback (test or sealed), each evaluation's split, the sealed
experiment's validation config, validation baseline, nomination and final test evaluation

Revision ID: 0008_feedback_modes
Revises: 0007_evaluators
Create Date: 2026-12-04 03:30:00.000000
"""

from alembic import op
import sqlalchemy as sa


revision = '0008_feedback_modes'
down_revision = '0007_evaluators'


def upgrade() -> None:
    with op.batch_alter_table('experiments', schema=None) as batch_op:
        batch_op.add_column(
            sa.Column('feedback', sa.String(length=16), nullable=False, server_default='test')
        )
        batch_op.add_column(sa.Column('validation_eval_key', sa.String(length=64), nullable=True))
        batch_op.add_column(sa.Column('validation_eval_config', sa.JSON(), nullable=True))
        batch_op.add_column(sa.Column('validation_baseline_submission_id', sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column('nominated_submission_id', sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column('final_submission_id', sa.Integer(), nullable=True))
    with op.batch_alter_table('submissions', schema=None) as batch_op:
        batch_op.add_column(sa.Column('split', sa.String(length=16), nullable=False, server_default='test'))
        batch_op.add_column(sa.Column('final_of', sa.Integer(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('submissions', schema=None) as batch_op:
        batch_op.drop_column('final_of')
        batch_op.drop_column('split')
    with op.batch_alter_table('experiments', schema=None) as batch_op:
        batch_op.drop_column('final_submission_id')
        batch_op.drop_column('nominated_submission_id')
        batch_op.drop_column('validation_baseline_submission_id')
        batch_op.drop_column('validation_eval_config')
        batch_op.drop_column('validation_eval_key')
        batch_op.drop_column('feedback')
