"""initial schema"""

from alembic import op
import sqlalchemy as sa


revision = '0001'
down_revision = None


def upgrade() -> None:
    op.create_table('baseline_cache',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('task', sa.String(length=64), nullable=False),
    sa.Column('model', sa.String(length=512), nullable=False),
    sa.Column('eval_key', sa.String(length=64), nullable=False),
    sa.Column('fingerprint', sa.String(length=64), nullable=False),
    sa.Column('submission_id', sa.Integer(), nullable=False),
    sa.Column('score', sa.Float(), nullable=False),
    sa.Column('score_opencompass', sa.Float(), nullable=True),
    sa.Column('score_flexible', sa.Float(), nullable=True),
    sa.Column('score_strict', sa.Float(), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('task', 'model', 'eval_key', name='uq_baseline_key')
    )
    op.create_table('experiments',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('name', sa.String(length=253), nullable=False),
    sa.Column('task', sa.String(length=64), nullable=False),
    sa.Column('model', sa.String(length=512), nullable=False),
    sa.Column('base_model_dir', sa.Text(), nullable=False),
    sa.Column('workspace', sa.Text(), nullable=False),
    sa.Column('agent_workspace', sa.Text(), nullable=True),
    sa.Column('output_dir', sa.Text(), nullable=False),
    sa.Column('agent', sa.String(length=512), nullable=True),
    sa.Column('driver_model', sa.String(length=512), nullable=True),
    sa.Column('token_hash', sa.String(length=64), nullable=False),
    sa.Column('status', sa.Enum('pending', 'running', 'completed', 'interrupted', 'failed', 'timed_out', name='experimentstatus', native_enum=False, length=16), nullable=False),
    sa.Column('message', sa.Text(), nullable=True),
    sa.Column('timeout_s', sa.Integer(), nullable=False),
    sa.Column('max_submissions', sa.Integer(), nullable=False),
    sa.Column('eval_key', sa.String(length=64), nullable=False),
    sa.Column('eval_config', sa.JSON(), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('start_time', sa.DateTime(timezone=True), nullable=True),
    sa.Column('end_time', sa.DateTime(timezone=True), nullable=True),
    sa.Column('finished_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('baseline_submission_id', sa.Integer(), nullable=True),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('name'),
    sa.UniqueConstraint('token_hash')
    )
    op.create_table('submissions',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('experiment_id', sa.Integer(), nullable=False),
    sa.Column('is_baseline', sa.Boolean(), nullable=False),
    sa.Column('model_path', sa.Text(), nullable=False),
    sa.Column('fingerprint', sa.String(length=64), nullable=False),
    sa.Column('eval_key', sa.String(length=64), nullable=False),
    sa.Column('status', sa.Enum('queued', 'running', 'scored', 'failed', name='submissionstatus', native_enum=False, length=16), nullable=False),
    sa.Column('score', sa.Float(), nullable=True),
    sa.Column('score_opencompass', sa.Float(), nullable=True),
    sa.Column('score_flexible', sa.Float(), nullable=True),
    sa.Column('score_strict', sa.Float(), nullable=True),
    sa.Column('n_samples', sa.Integer(), nullable=True),
    sa.Column('error', sa.Text(), nullable=True),
    sa.Column('attempts', sa.Integer(), nullable=False),
    sa.Column('reused_from', sa.Integer(), nullable=True),
    sa.Column('eval_seconds', sa.Float(), nullable=True),
    sa.Column('worker', sa.String(length=255), nullable=True),
    sa.Column('lease_expires_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('details', sa.JSON(), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('started_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('finished_at', sa.DateTime(timezone=True), nullable=True),
    sa.ForeignKeyConstraint(['experiment_id'], ['experiments.id'], ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id')
    )
    with op.batch_alter_table('submissions', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_submissions_experiment_id'), ['experiment_id'], unique=False)
        batch_op.create_index('ix_submissions_fingerprint', ['eval_key', 'fingerprint'], unique=False)
        batch_op.create_index('ix_submissions_status', ['status'], unique=False)



def downgrade() -> None:
    with op.batch_alter_table('submissions', schema=None) as batch_op:
        batch_op.drop_index('ix_submissions_status')
        batch_op.drop_index('ix_submissions_fingerprint')
        batch_op.drop_index(batch_op.f('ix_submissions_experiment_id'))

    op.drop_table('submissions')
    op.drop_table('experiments')
    op.drop_table('baseline_cache')
