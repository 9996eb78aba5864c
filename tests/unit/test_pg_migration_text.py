"""A released migration's SQL never changes (typedq.broker.postgres.schema: a change is a
new migration), even when its module is reorganized: migration 6 is kept in three part
modules joined in order, and the text they join to is the one released."""

from __future__ import annotations

import hashlib

from typedq.broker.postgres import migration_6, schema

#: The sha256 of migration 6's SQL as released, computed from the single module
#: ``migration_6.py`` held before it was split into part modules (main at 9920334,
#: 37,911 characters). A schema migrated by an earlier release ran exactly this text;
#: a different digest means the split (or an edit) changed what runs.
RELEASED_SHA256 = "4001ce6ac45f7454a6cd97bc8ca2aebad9b4b7b02a7411cc1626ab76323bf096"


def test_migration_6_joined_from_its_parts_is_the_released_text() -> None:
    assert len(migration_6.SQL) == 37_911
    assert hashlib.sha256(migration_6.SQL.encode()).hexdigest() == RELEASED_SHA256
    # And it is what migrate applies as migration 6.
    assert schema.MIGRATIONS[5] == migration_6.SQL


#: Migrations 14, 15, 16 and 17 restate released functions through ``released.function_of``:
#: the digests of their SQL as released, so a change of that helper cannot change what
#: a schema migrated by them ran.
RESTATED_SHA256 = {
    14: "73f76e8685f152f5d66a7ee816809213ef355f991cdf0a3dc09c659a940470ed",
    15: "627d11269e7892b1e934d7c50df50f70672ae194b80787c9e587fe4788ce5ef5",
    16: "96bfba981d118aedc6f4e93ab22823162e4d3e9489decc624fb712f841405563",
    17: "b61c9fc3ab296964e07cb21708c4de7df7153dea96fceacb9f58902af7d3f5c3",
}


def test_migrations_that_restate_released_functions_keep_their_text() -> None:
    for version, digest in RESTATED_SHA256.items():
        sql = schema.MIGRATIONS[version - 1]
        assert hashlib.sha256(sql.encode()).hexdigest() == digest, version
