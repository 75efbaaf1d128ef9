"""The conversation store's schema, as ordered migrations keyed by `PRAGMA user_version`.

MIGRATIONS[i] upgrades a database from version i to i + 1. To change the schema, append one entry
(e.g. `"ALTER TABLE messages ADD COLUMN rating INTEGER"`, or a function for a change SQL cannot say
alone) and add the field to the matching dataclass in records.py; never edit an entry that has shipped:
users' databases already ran it.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable

from localchat.errors import DatabaseSchemaError

Migration = str | Callable[[sqlite3.Connection], None]  # SQL statements (";"-separated), or a function

_INITIAL = """
CREATE TABLE IF NOT EXISTS conversations (
    id TEXT PRIMARY KEY,
    title TEXT NOT NULL,
    model TEXT NOT NULL DEFAULT '',
    system_prompt TEXT NOT NULL DEFAULT '',
    temperature REAL,
    top_p REAL,
    max_tokens INTEGER,
    created_at REAL NOT NULL,
    updated_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS messages (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    conversation_id TEXT NOT NULL REFERENCES conversations(id) ON DELETE CASCADE,
    role TEXT NOT NULL CHECK (role IN ('system', 'user', 'assistant')),
    content TEXT NOT NULL DEFAULT '',
    status TEXT NOT NULL DEFAULT 'done',
    error TEXT,
    finish_reason TEXT,
    prompt_tokens INTEGER NOT NULL DEFAULT 0,
    completion_tokens INTEGER NOT NULL DEFAULT 0,
    tokens_per_s REAL,
    created_at REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS messages_by_conversation ON messages (conversation_id, id);
CREATE INDEX IF NOT EXISTS conversations_by_update ON conversations (updated_at DESC);
"""


def _add_message_model(db: sqlite3.Connection) -> None:
    """messages.model: which model wrote each answer. Some version-1 databases already have it (it was
    added without a version bump for a while), hence the check."""
    if "model" not in {row[1] for row in db.execute("PRAGMA table_info(messages)")}:
        db.execute("ALTER TABLE messages ADD COLUMN model TEXT")


# Saved presets (a system prompt and sampling settings the settings dialog applies to a chat) and
# app-wide UI settings (e.g. the default system prompt of new chats), as key/value text.
_PRESETS_AND_SETTINGS = """
CREATE TABLE IF NOT EXISTS presets (
    name TEXT PRIMARY KEY,
    system_prompt TEXT NOT NULL DEFAULT '',
    temperature REAL,
    top_p REAL,
    max_tokens INTEGER,
    created_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS app_settings (
    key TEXT PRIMARY KEY,
    value TEXT NOT NULL
);
"""

# Earlier versions of an answer that Regenerate replaced (the UI's "< 2/3 >" and Compare): kept with
# the answer now in the conversation, and dropped with it.
_ALTERNATIVES = """
CREATE TABLE IF NOT EXISTS answer_alternatives (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    message_id INTEGER NOT NULL REFERENCES messages(id) ON DELETE CASCADE,
    content TEXT NOT NULL DEFAULT '',
    model TEXT,
    finish_reason TEXT,
    completion_tokens INTEGER NOT NULL DEFAULT 0,
    tokens_per_s REAL,
    created_at REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS alternatives_by_message ON answer_alternatives (message_id, id);
"""

# Files attached to a message in the web UI. A picture's bytes live in <data dir>/attachments/<sha256>.<ext>
# (never as base64 rows); a document keeps the text the model reads (already cut to the model's context).
_ATTACHMENTS = """
CREATE TABLE IF NOT EXISTS attachments (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    message_id INTEGER NOT NULL REFERENCES messages(id) ON DELETE CASCADE,
    kind TEXT NOT NULL CHECK (kind IN ('image', 'document')),
    name TEXT NOT NULL,
    media_type TEXT NOT NULL,
    size INTEGER NOT NULL DEFAULT 0,
    sha256 TEXT,
    text TEXT,
    truncated INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS attachments_by_message ON attachments (message_id, id);
CREATE INDEX IF NOT EXISTS attachments_by_hash ON attachments (sha256);
"""

# Speculative decoding's share of an answer (the UI's per-message stats; 0: written without it): draft
# tokens the model scored, of which it accepted, and its passes over the weights that gave tokens.
_SPECULATION_STATS = """
ALTER TABLE messages ADD COLUMN spec_draft_tokens INTEGER NOT NULL DEFAULT 0;
ALTER TABLE messages ADD COLUMN spec_accepted_tokens INTEGER NOT NULL DEFAULT 0;
ALTER TABLE messages ADD COLUMN target_passes INTEGER NOT NULL DEFAULT 0;
"""

MIGRATIONS: list[Migration] = [
    _INITIAL,  # 0 -> 1 (IF NOT EXISTS: databases from before versioning already hold it)
    _add_message_model,  # 1 -> 2
    _PRESETS_AND_SETTINGS,  # 2 -> 3
    _ALTERNATIVES,  # 3 -> 4
    _ATTACHMENTS,  # 4 -> 5
    _SPECULATION_STATS,  # 5 -> 6
]


def schema_version() -> int:
    return len(MIGRATIONS)


def migrate(db: sqlite3.Connection, path: object) -> int:
    """Bring the database up to the current schema; returns the version it was at. Call inside a
    transaction: a migration that fails leaves the database as it was."""
    found = int(db.execute("PRAGMA user_version").fetchone()[0])
    if found > schema_version():
        raise DatabaseSchemaError(
            f"The conversations database {path} was written by a newer localchat (schema {found}, this"
            f" version knows up to {schema_version()}). Upgrade localchat, or set LOCALCHAT_HOME to"
            " another folder."
        )
    for version in range(found, schema_version()):
        migration = MIGRATIONS[version]
        try:
            if callable(migration):
                migration(db)
            else:  # not executescript(): it commits on its own, outside the caller's transaction
                for statement in migration.split(";"):
                    if statement.strip():
                        db.execute(statement)
        except sqlite3.Error as exc:
            raise DatabaseSchemaError(
                f"Updating the conversations database {path} to schema {version + 1} failed ({exc});"
                " it was left as it was. Check that the disk is not full, then start localchat again."
            ) from exc
        db.execute(f"PRAGMA user_version={version + 1}")
    return found
