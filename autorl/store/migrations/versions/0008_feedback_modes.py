"""feedback modes: an experiment's feedback (test or sealed), each evaluation's split, the sealed
experiment's validation config, validation baseline, nomination and final test evaluation"""

import sqlalchemy as sa

from autorl.store.migrations.added_columns import added_columns


revision = '0008_feedback_modes'
down_revision = '0007_evaluators'

upgrade, downgrade = added_columns(
    experiments=[
        sa.Column('feedback', sa.String(length=16), nullable=False, server_default='test'),
        sa.Column('validation_eval_key', sa.String(length=64), nullable=True),
        sa.Column('validation_eval_config', sa.JSON(), nullable=True),
        sa.Column('validation_baseline_submission_id', sa.Integer(), nullable=True),
        sa.Column('nominated_submission_id', sa.Integer(), nullable=True),
        sa.Column('final_submission_id', sa.Integer(), nullable=True),
    ],
    submissions=[
        sa.Column('split', sa.String(length=16), nullable=False, server_default='test'),
        sa.Column('final_of', sa.Integer(), nullable=True),
    ],
)
