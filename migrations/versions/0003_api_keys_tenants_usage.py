"""api keys; a tenant on knowledge bases, conversations and streams; usage columns

Rows from before tenants belong to ``local``, the tenant of the open (keyless) mode, so a key
created with ``--tenant local`` reaches them. Knowledge-base names become unique per tenant.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-30 15:30:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_TENANT = sa.Column("tenant", sa.String(length=64), nullable=False, server_default="local")
# SQLite's unnamed unique constraint on knowledge_bases.name gets this name for the rebuild
_NAMING = {"uq": "uq_%(table_name)s_%(column_0_name)s"}


def _old_name_constraint() -> str:
    if op.get_bind().dialect.name == "postgresql":
        return "knowledge_bases_name_key"
    return "uq_knowledge_bases_name"


def upgrade() -> None:
    op.create_table(
        "api_keys",
        sa.Column("id", sa.String(length=16), nullable=False),
        sa.Column("tenant", sa.String(length=64), nullable=False),
        sa.Column("name", sa.String(length=128), nullable=True),
        sa.Column("key_hash", sa.String(length=64), nullable=False),
        sa.Column("prefix", sa.String(length=32), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("revoked_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_api_keys_tenant", "api_keys", ["tenant"])
    with op.batch_alter_table("knowledge_bases", naming_convention=_NAMING) as batch:
        batch.add_column(_TENANT.copy())
        batch.drop_constraint(_old_name_constraint(), type_="unique")
        batch.create_unique_constraint("uq_knowledge_bases_tenant_name", ["tenant", "name"])
    with op.batch_alter_table("conversations") as batch:
        batch.add_column(_TENANT.copy())
    with op.batch_alter_table("streams") as batch:
        batch.add_column(_TENANT.copy())
        for name in ("prompt_tokens", "cached_tokens", "completion_tokens"):
            batch.add_column(sa.Column(name, sa.Integer(), nullable=False, server_default="0"))
        batch.create_index("ix_streams_tenant_created", ["tenant", "created_at"])


def downgrade() -> None:
    with op.batch_alter_table("streams") as batch:
        batch.drop_index("ix_streams_tenant_created")
        for name in ("completion_tokens", "cached_tokens", "prompt_tokens", "tenant"):
            batch.drop_column(name)
    with op.batch_alter_table("conversations") as batch:
        batch.drop_column("tenant")
    with op.batch_alter_table("knowledge_bases", naming_convention=_NAMING) as batch:
        batch.drop_constraint("uq_knowledge_bases_tenant_name", type_="unique")
        batch.create_unique_constraint(_old_name_constraint(), ["name"])
        batch.drop_column("tenant")
    op.drop_index("ix_api_keys_tenant", table_name="api_keys")
    op.drop_table("api_keys")
