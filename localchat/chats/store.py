"""Conversations and messages in SQLite (WAL), in the data dir. Safe to share across threads.

One connection guarded by a lock: writes are tiny and SQLite serializes them anyway, and a single
connection keeps the WAL checkpointing simple. Every multi-row change is one transaction, so a
process killed mid-write leaves either the old or the new state, never half of it.
"""

from __future__ import annotations

import sqlite3
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

from localchat.attachments.files import AttachmentFiles
from localchat.chats.records import (
    DONE,
    ERROR,
    STREAMING,
    Alternative,
    Attachment,
    Conversation,
    Message,
    NewMessage,
    Preset,
    from_row,
)
from localchat.chats.store_schema import migrate
from localchat.errors import NotFoundError
from localchat.paths import private_dir, private_file

ATTACHMENTS_DIR = "attachments"  # beside the database: pictures attached in the web UI
_CONVERSATION_SETTINGS = ("system_prompt", "temperature", "top_p", "max_tokens", "model")
_MESSAGE_UPDATES = (
    "content",
    "status",
    "error",
    "finish_reason",
    "prompt_tokens",
    "completion_tokens",
    "tokens_per_s",
    "model",
    "spec_draft_tokens",
    "spec_accepted_tokens",
    "target_passes",
)

# A message row with how many earlier versions of it Regenerate kept.
_MESSAGE_COLUMNS = (
    "m.*, (SELECT COUNT(*) FROM answer_alternatives a WHERE a.message_id = m.id) AS alternatives,"
    " (SELECT COUNT(*) FROM answer_alternatives a WHERE a.message_id = m.id AND a.created_at < m.created_at)"
    " AS earlier_versions"
)


class Store:
    def __init__(self, path: Path) -> None:
        private_dir(path.parent)
        private_file(path)  # every conversation is in it: owner-only, and so its WAL and SHM files
        self.path = path
        self.files = AttachmentFiles(path.parent / ATTACHMENTS_DIR)
        self._lock = threading.RLock()
        self._db = sqlite3.connect(path, check_same_thread=False, isolation_level=None, timeout=10.0)
        self._db.row_factory = sqlite3.Row
        self._db.execute("PRAGMA journal_mode=WAL")
        # NORMAL under WAL never corrupts on a crash; at worst the last commits before a power cut are lost.
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.execute("PRAGMA foreign_keys=ON")
        try:
            with self._tx() as db:
                migrate(db, path)
        except BaseException:
            self._db.close()
            raise

    def close(self) -> None:
        with self._lock:
            self._db.close()

    @contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                yield self._db
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")

    def _query(self, sql: str, args: tuple[Any, ...] = ()) -> list[sqlite3.Row]:
        with self._lock:
            return self._db.execute(sql, args).fetchall()

    # -- conversations --------------------------------------------------------------------------------

    def create_conversation(
        self, title: str, messages: Sequence[NewMessage] = (), **settings: Any
    ) -> Conversation:
        """Create a conversation (and its first messages) in one transaction."""
        now = time.time()
        conv = Conversation(uuid.uuid4().hex, title or "New chat", created_at=now, updated_at=now)
        for key, value in settings.items():
            if key not in _CONVERSATION_SETTINGS:
                raise TypeError(f"unknown conversation setting {key!r}")
            setattr(conv, key, value)
        with self._tx() as db:
            db.execute(
                "INSERT INTO conversations (id, title, model, system_prompt, temperature, top_p, max_tokens,"
                " created_at, updated_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    conv.id,
                    conv.title,
                    conv.model,
                    conv.system_prompt,
                    conv.temperature,
                    conv.top_p,
                    conv.max_tokens,
                    now,
                    now,
                ),
            )
            self._insert_messages(db, conv.id, messages, now)
        return conv

    def get_conversation(self, conv_id: str) -> Conversation:
        rows = self._query("SELECT * FROM conversations WHERE id = ?", (conv_id,))
        if not rows:
            raise NotFoundError("This conversation does not exist (it may have been deleted).")
        return from_row(Conversation, rows[0])

    def list_conversations(self, query: str = "", limit: int = 200) -> list[Conversation]:
        """Newest first; `query` matches the title or any message text, case-insensitively."""
        if not query.strip():
            rows = self._query("SELECT * FROM conversations ORDER BY updated_at DESC LIMIT ?", (limit,))
        else:
            pattern = "%" + query.strip().replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"
            rows = self._query(
                "SELECT * FROM conversations c WHERE c.title LIKE ?1 ESCAPE '\\' OR EXISTS (SELECT 1 FROM"
                " messages m WHERE m.conversation_id = c.id AND m.content LIKE ?1 ESCAPE '\\')"
                " ORDER BY updated_at DESC LIMIT ?2",
                (pattern, limit),
            )
        return [from_row(Conversation, r) for r in rows]

    def rename_conversation(self, conv_id: str, title: str) -> Conversation:
        with self._tx() as db:
            db.execute("UPDATE conversations SET title = ? WHERE id = ?", (title, conv_id))
        return self.get_conversation(conv_id)

    def update_settings(self, conv_id: str, **settings: Any) -> Conversation:
        unknown = set(settings) - set(_CONVERSATION_SETTINGS)
        if unknown:
            raise TypeError(f"unknown conversation settings {sorted(unknown)}")
        if settings:
            assignments = ", ".join(f"{key} = ?" for key in settings)
            with self._tx() as db:
                db.execute(
                    f"UPDATE conversations SET {assignments} WHERE id = ?", (*settings.values(), conv_id)
                )
        return self.get_conversation(conv_id)

    def delete_conversation(self, conv_id: str) -> None:
        """Delete it, its messages, and the picture files no other message still uses."""
        with self._dropping_files("m.conversation_id = ?", (conv_id,)) as db:
            db.execute("DELETE FROM conversations WHERE id = ?", (conv_id,))

    # -- presets and app settings ----------------------------------------------------------------------

    def list_presets(self) -> list[Preset]:
        return [
            from_row(Preset, r) for r in self._query("SELECT * FROM presets ORDER BY name COLLATE NOCASE")
        ]

    def save_preset(self, preset: Preset) -> Preset:
        """Create or replace the preset of that name."""
        preset.created_at = preset.created_at or time.time()
        with self._tx() as db:
            db.execute(
                "INSERT OR REPLACE INTO presets (name, system_prompt, temperature, top_p, max_tokens, created_at)"
                " VALUES (?, ?, ?, ?, ?, ?)",
                (preset.name, preset.system_prompt, preset.temperature, preset.top_p, preset.max_tokens,
                 preset.created_at),
            )  # fmt: skip
        return preset

    def delete_preset(self, name: str) -> None:
        with self._tx() as db:
            db.execute("DELETE FROM presets WHERE name = ?", (name,))

    def get_setting(self, key: str, default: str = "") -> str:
        rows = self._query("SELECT value FROM app_settings WHERE key = ?", (key,))
        return str(rows[0]["value"]) if rows else default

    def set_setting(self, key: str, value: str) -> None:
        with self._tx() as db:
            db.execute("INSERT OR REPLACE INTO app_settings (key, value) VALUES (?, ?)", (key, value))

    # -- messages -------------------------------------------------------------------------------------

    def add_messages(self, conv_id: str, messages: Sequence[NewMessage]) -> list[Message]:
        """Append messages in one transaction and bump the conversation to the top of the list."""
        now = time.time()
        with self._tx() as db:
            ids = self._insert_messages(db, conv_id, messages, now)
            db.execute("UPDATE conversations SET updated_at = ? WHERE id = ?", (now, conv_id))
        return [self.get_message(i) for i in ids]

    def get_message(self, message_id: int) -> Message:
        rows = self._query(f"SELECT {_MESSAGE_COLUMNS} FROM messages m WHERE id = ?", (message_id,))
        if not rows:
            raise NotFoundError("This message does not exist (it may have been deleted).")
        return self._with_attachments([from_row(Message, rows[0])], "a.message_id = ?", (message_id,))[0]

    def get_messages(self, conv_id: str) -> list[Message]:
        rows = self._query(
            f"SELECT {_MESSAGE_COLUMNS} FROM messages m WHERE conversation_id = ? ORDER BY id", (conv_id,)
        )
        messages = [from_row(Message, r) for r in rows]
        where = "a.message_id IN (SELECT id FROM messages WHERE conversation_id = ?)"
        return self._with_attachments(messages, where, (conv_id,))

    def _with_attachments(self, messages: list[Message], where: str, args: tuple[Any, ...]) -> list[Message]:
        by_message: dict[int, list[Attachment]] = {}
        for row in self._query(f"SELECT * FROM attachments a WHERE {where} ORDER BY a.id", args):
            attachment = from_row(Attachment, row)
            attachment.truncated = bool(attachment.truncated)
            by_message.setdefault(attachment.message_id, []).append(attachment)
        for m in messages:
            m.attachments = by_message.get(m.id, [])
        return messages

    def image_attachment(self, sha256: str) -> Attachment:
        """A stored picture by its hash (the UI's thumbnails); NotFoundError when no message has it."""
        rows = self._query("SELECT * FROM attachments WHERE sha256 = ? AND kind = 'image' LIMIT 1", (sha256,))
        if not rows:
            raise NotFoundError("This picture does not exist (its message may have been deleted).")
        return from_row(Attachment, rows[0])

    def read_image(self, attachment: Attachment) -> bytes:
        assert attachment.sha256 is not None
        return self.files.read(attachment.sha256, attachment.file_name.rsplit(".", 1)[1])

    @contextmanager
    def _dropping_files(self, where: str, args: tuple[Any, ...]) -> Iterator[sqlite3.Connection]:
        """A transaction that deletes messages (those `where` matches, on messages m): afterwards the
        picture files they used that no remaining message uses are deleted too."""
        with self._tx() as db:
            used = db.execute(
                "SELECT DISTINCT a.sha256, a.media_type FROM attachments a JOIN messages m ON m.id ="
                f" a.message_id WHERE a.sha256 IS NOT NULL AND {where}",
                args,
            ).fetchall()
            yield db
            orphans = [
                Attachment(0, 0, "image", "", row["media_type"], sha256=row["sha256"])
                for row in used
                if db.execute(
                    "SELECT 1 FROM attachments WHERE sha256 = ? LIMIT 1", (row["sha256"],)
                ).fetchone()
                is None
            ]
        for orphan in orphans:  # after the commit: a crash in between leaves a stray file, never a hole
            assert orphan.sha256 is not None
            with suppress(OSError):  # a file that cannot be removed now is only wasted space
                self.files.delete(orphan.sha256, orphan.file_name.rsplit(".", 1)[1])

    def update_message(self, message_id: int, **fields: Any) -> None:
        unknown = set(fields) - set(_MESSAGE_UPDATES)
        if unknown:
            raise TypeError(f"unknown message fields {sorted(unknown)}")
        assignments = ", ".join(f"{key} = ?" for key in fields)
        with self._tx() as db:
            db.execute(f"UPDATE messages SET {assignments} WHERE id = ?", (*fields.values(), message_id))

    def delete_message(self, conv_id: str, message_id: int) -> None:
        """Drop one message of a conversation (the UI's per-message Delete)."""
        with self._dropping_files("m.conversation_id = ? AND m.id = ?", (conv_id, message_id)) as db:
            db.execute("DELETE FROM messages WHERE conversation_id = ? AND id = ?", (conv_id, message_id))

    def regenerate_answer(self, conv_id: str, answer_id: int) -> Message:
        """A new (streaming) answer in place of `answer_id`, which becomes its newest alternative along
        with the alternatives it had: nothing Regenerate replaces is lost."""
        old = self.get_message(answer_id)
        now = time.time()
        with self._tx() as db:
            (new_id,) = self._insert_messages(db, conv_id, [NewMessage("assistant", "", STREAMING)], now)
            db.execute(
                "UPDATE answer_alternatives SET message_id = ? WHERE message_id = ?", (new_id, answer_id)
            )
            if old.content.strip() and old.status != ERROR:
                db.execute(
                    "INSERT INTO answer_alternatives (message_id, content, model, finish_reason,"
                    " completion_tokens, tokens_per_s, created_at) VALUES (?, ?, ?, ?, ?, ?, ?)",
                    (new_id, old.content, old.model, old.finish_reason, old.completion_tokens,
                     old.tokens_per_s, old.created_at),
                )  # fmt: skip
            db.execute("DELETE FROM messages WHERE conversation_id = ? AND id = ?", (conv_id, answer_id))
            db.execute("UPDATE conversations SET updated_at = ? WHERE id = ?", (now, conv_id))
        return self.get_message(new_id)

    def alternatives(self, message_id: int) -> list[Alternative]:
        rows = self._query(
            "SELECT * FROM answer_alternatives WHERE message_id = ? ORDER BY id", (message_id,)
        )
        return [from_row(Alternative, r) for r in rows]

    def use_alternative(self, message_id: int, alternative_id: int) -> Message:
        """Swap an answer with one of its alternatives: the chosen version is the one the chat goes on
        from (and the one the model sees), the other is kept in its place."""
        current = self.get_message(message_id)
        rows = self._query(
            "SELECT * FROM answer_alternatives WHERE id = ? AND message_id = ?", (alternative_id, message_id)
        )
        if not rows:
            raise NotFoundError("That version of the answer does not exist.")
        alt = from_row(Alternative, rows[0])
        fields_ = ("content", "model", "finish_reason", "completion_tokens", "tokens_per_s", "created_at")
        with self._tx() as db:
            db.execute(
                "UPDATE messages SET content = ?, model = ?, finish_reason = ?, completion_tokens = ?,"
                " tokens_per_s = ?, created_at = ?, status = ? WHERE id = ?",
                (*(getattr(alt, f) for f in fields_), DONE, message_id),
            )
            db.execute(
                "UPDATE answer_alternatives SET content = ?, model = ?, finish_reason = ?, completion_tokens = ?,"
                " tokens_per_s = ?, created_at = ? WHERE id = ?",
                (*(getattr(current, f) for f in fields_), alternative_id),
            )
        return self.get_message(message_id)

    def truncate_after(self, conv_id: str, message_id: int, *, inclusive: bool = False) -> None:
        """Drop the messages after `message_id` (and it too when `inclusive`): edit and regenerate."""
        op = ">=" if inclusive else ">"
        with self._dropping_files(f"m.conversation_id = ? AND m.id {op} ?", (conv_id, message_id)) as db:
            db.execute(f"DELETE FROM messages WHERE conversation_id = ? AND id {op} ?", (conv_id, message_id))

    def fail_interrupted(self, message: str) -> int:
        """Mark answers left 'streaming' by a previous process (crash, kill) as failed; returns how many."""
        with self._tx() as db:
            cursor = db.execute(
                "UPDATE messages SET status = ?, error = ? WHERE status = ?", (ERROR, message, STREAMING)
            )
            return cursor.rowcount

    def _insert_messages(
        self, db: sqlite3.Connection, conv_id: str, messages: Sequence[NewMessage], now: float
    ) -> list[int]:
        ids: list[int] = []
        for m in messages:
            extra = {k: v for k, v in m.extra.items() if k in _MESSAGE_UPDATES}
            columns = ["conversation_id", "role", "content", "status", "created_at", *extra]
            cursor = db.execute(
                f"INSERT INTO messages ({', '.join(columns)}) VALUES ({', '.join('?' * len(columns))})",
                (conv_id, m.role, m.content, m.status, now, *extra.values()),
            )
            assert cursor.lastrowid is not None
            ids.append(cursor.lastrowid)
            for a in m.attachments:
                db.execute(
                    "INSERT INTO attachments (message_id, kind, name, media_type, size, sha256, text, truncated)"
                    " VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                    (
                        cursor.lastrowid,
                        a.kind,
                        a.name,
                        a.media_type,
                        a.size,
                        a.sha256,
                        a.text,
                        int(a.truncated),
                    ),
                )
        return ids
