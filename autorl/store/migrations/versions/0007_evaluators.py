"""evaluator workers report themselves alive (queue, backends, last heartbeat)"""

from alembic import op
import sqlalchemy as sa


revision = '0007_evaluators'
down_revision = '0006_correctness'


def upgrade() -> None:
    op.create_table(
        'evaluators',
        sa.Column('name', sa.String(length=255), nullable=False),
        sa.Column('queue', sa.String(length=255), nullable=False),
        sa.Column('backends', sa.JSON(), nullable=False),
        sa.Column('started_at', sa.DateTime(timezone=True), nullable=False),
        sa.Column('last_seen', sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint('name'),
    )
    op.create_index('ix_evaluators_queue', 'evaluators', ['queue'], unique=False)


def downgrade() -> None:
    op.drop_index('ix_evaluators_queue', table_name='evaluators')
    op.drop_table('evaluators')
