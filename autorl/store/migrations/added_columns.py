"""What most migrations do: add columns to tables on the way up and drop them, last first, on the
way down, from one list, so that the two directions cannot disagree."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import sqlalchemy as sa
from alembic import op


def added_columns(**tables: list[sa.Column[Any]]) -> tuple[Callable[[], None], Callable[[], None]]:
    """``upgrade, downgrade`` of a migration that adds each table's columns (keyword: the table)."""

    def upgrade() -> None:
        for table, columns in tables.items():
            with op.batch_alter_table(table) as batch:
                for column in columns:
                    batch.add_column(column)

    def downgrade() -> None:
        for table, columns in reversed(tables.items()):
            with op.batch_alter_table(table) as batch:
                for column in reversed(columns):
                    batch.drop_column(column.name)

    return upgrade, downgrade
