"""Each answer records the model that wrote it (`messages.model`), also in databases made before the
column existed."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from localchat.chats.records import NewMessage
from localchat.chats.store import Store


def test_old_databases_gain_the_model_column(tmp_path: Path) -> None:
    path = tmp_path / "old.sqlite3"
    db = sqlite3.connect(path)
    db.executescript(
        "CREATE TABLE conversations (id TEXT PRIMARY KEY, title TEXT NOT NULL, model TEXT NOT NULL DEFAULT '',"
        " system_prompt TEXT NOT NULL DEFAULT '', temperature REAL, top_p REAL, max_tokens INTEGER,"
        " created_at REAL NOT NULL, updated_at REAL NOT NULL);"
        "CREATE TABLE messages (id INTEGER PRIMARY KEY AUTOINCREMENT, conversation_id TEXT NOT NULL,"
        " role TEXT NOT NULL, content TEXT NOT NULL DEFAULT '', status TEXT NOT NULL DEFAULT 'done',"
        " error TEXT, finish_reason TEXT, prompt_tokens INTEGER NOT NULL DEFAULT 0,"
        " completion_tokens INTEGER NOT NULL DEFAULT 0, tokens_per_s REAL, created_at REAL NOT NULL);"
        "INSERT INTO conversations VALUES ('c1', 'old chat', 'smollm2-135m', '', NULL, NULL, NULL, 1, 1);"
        "INSERT INTO messages (conversation_id, role, content, created_at) VALUES ('c1', 'user', 'hi', 1);"
    )
    db.close()
    store = Store(path)
    (old,) = store.get_messages("c1")
    assert old.content == "hi" and old.model is None
    (answer,) = store.add_messages("c1", [NewMessage("assistant", "hello")])
    store.update_message(answer.id, model="org/tiny-GGUF:Q4_0")
    assert store.get_message(answer.id).model == "org/tiny-GGUF:Q4_0"
    store.close()
    assert Store(path).get_message(answer.id).model == "org/tiny-GGUF:Q4_0"  # and it opens again
