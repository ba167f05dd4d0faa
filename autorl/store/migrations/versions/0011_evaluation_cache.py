"""the results of `autorl evaluate`, one per snapshot fingerprint and evaluation key"""

from alembic import op
import sqlalchemy as sa


revision = '0011_evaluation_cache'
down_revision = '0010_submission_numbers'


def upgrade() -> None:
    op.create_table(
        'evaluation_cache',
        sa.Column('id', sa.Integer(), nullable=False),
        sa.Column('task', sa.String(length=64), nullable=False),
        sa.Column('model', sa.Text(), nullable=False),
        sa.Column('fingerprint', sa.String(length=64), nullable=False),
        sa.Column('eval_key', sa.String(length=64), nullable=False),
        sa.Column('eval_config', sa.JSON(), nullable=False),
        sa.Column('score', sa.Float(), nullable=False),
        sa.Column('score_opencompass', sa.Float(), nullable=True),
        sa.Column('score_flexible', sa.Float(), nullable=True),
        sa.Column('score_strict', sa.Float(), nullable=True),
        sa.Column('n_samples', sa.Integer(), nullable=False),
        sa.Column('correctness', sa.Text(), nullable=False),
        sa.Column('problems_digest', sa.String(length=64), nullable=False),
        sa.Column('eval_seconds', sa.Float(), nullable=False),
        sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint('id'),
        sa.UniqueConstraint('fingerprint', 'eval_key', name='uq_evaluation_cache_key'),
    )


def downgrade() -> None:
    op.drop_table('evaluation_cache')
