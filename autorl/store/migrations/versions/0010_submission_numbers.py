"""per-experiment submission numbers (what agents see as submission_id) and a per-row revision"""

from alembic import op
import sqlalchemy as sa

from autorl.store.migrations.added_columns import added_columns


revision = '0010_submission_numbers'
down_revision = '0009_costly_refusals'


add_columns, drop_columns = added_columns(
    submissions=[
        sa.Column('number', sa.Integer(), nullable=True),
        sa.Column('revision', sa.Integer(), nullable=False, server_default='0'),
    ],
)


def upgrade() -> None:
    add_columns()
    # The agent's submissions (neither a baseline nor a sealed experiment's final evaluation) are
    # numbered 1, 2, ... per experiment in the order they were received.
    submissions = sa.table(
        'submissions',
        sa.column('id', sa.Integer()),
        sa.column('experiment_id', sa.Integer()),
        sa.column('is_baseline', sa.Boolean()),
        sa.column('final_of', sa.Integer()),
        sa.column('created_at', sa.DateTime()),
        sa.column('number', sa.Integer()),
    )
    earlier = submissions.alias('earlier')

    def agents(table: sa.FromClause) -> sa.ColumnElement[bool]:
        return sa.and_(table.c.is_baseline == sa.false(), table.c.final_of.is_(None))

    rank = (
        sa.select(sa.func.count(earlier.c.id))
        .where(
            earlier.c.experiment_id == submissions.c.experiment_id,
            agents(earlier),
            sa.or_(
                earlier.c.created_at < submissions.c.created_at,
                sa.and_(earlier.c.created_at == submissions.c.created_at, earlier.c.id <= submissions.c.id),
            ),
        )
        .scalar_subquery()
    )
    op.execute(submissions.update().where(agents(submissions)).values(number=rank))
    with op.batch_alter_table('submissions', schema=None) as batch_op:
        batch_op.create_unique_constraint('uq_submissions_number', ['experiment_id', 'number'])


def downgrade() -> None:
    with op.batch_alter_table('submissions', schema=None) as batch_op:
        batch_op.drop_constraint('uq_submissions_number', type_='unique')
    drop_columns()
