"""The conversation store: CRUD, search, concurrency, restarts and crashes."""

from __future__ import annotations

import signal
import sqlite3
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from localchat.chats import store_schema
from localchat.chats.records import DONE, ERROR, STREAMING, NewMessage, title_from
from localchat.chats.store import Store
from localchat.chats.store_schema import schema_version
from localchat.errors import DatabaseSchemaError, NotFoundError

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    s = Store(tmp_path / "c.sqlite3")
    yield s
    s.close()


def test_wal_mode_and_schema(store: Store) -> None:
    db = sqlite3.connect(store.path)
    assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert db.execute("PRAGMA user_version").fetchone()[0] == schema_version()


def test_create_add_and_read_back_in_order(store: Store) -> None:
    conv = store.create_conversation(
        "Hello", [NewMessage("user", "hi")], system_prompt="be brief", temperature=0.3
    )
    store.add_messages(
        conv.id, [NewMessage("assistant", "hey", DONE, {"completion_tokens": 3}), NewMessage("user", "again")]
    )
    got = store.get_conversation(conv.id)
    assert (got.title, got.system_prompt, got.temperature, got.top_p) == ("Hello", "be brief", 0.3, None)
    messages = store.get_messages(conv.id)
    assert [(m.role, m.content) for m in messages] == [
        ("user", "hi"),
        ("assistant", "hey"),
        ("user", "again"),
    ]
    assert messages[1].completion_tokens == 3


def test_list_is_newest_first_and_search_matches_titles_and_text(store: Store) -> None:
    a = store.create_conversation("Pasta recipe", [NewMessage("user", "how to cook pasta")])
    b = store.create_conversation("Travel", [NewMessage("user", "trains in 100% Japan")])
    assert [c.id for c in store.list_conversations()] == [b.id, a.id]
    store.add_messages(a.id, [NewMessage("assistant", "boil water")])  # bumps `a` to the top
    assert [c.id for c in store.list_conversations()] == [a.id, b.id]
    assert [c.id for c in store.list_conversations("PASTA")] == [a.id]
    assert [c.id for c in store.list_conversations("boil")] == [a.id]
    assert [c.id for c in store.list_conversations("100%")] == [b.id]  # % is literal, not a wildcard
    assert store.list_conversations("0%J") == []


def test_rename_settings_truncate_delete(store: Store) -> None:
    conv = store.create_conversation(
        "t", [NewMessage("user", "1"), NewMessage("assistant", "2"), NewMessage("user", "3")]
    )
    assert store.rename_conversation(conv.id, "New name").title == "New name"
    assert store.update_settings(conv.id, top_p=0.5, max_tokens=10).max_tokens == 10
    first = store.get_messages(conv.id)[0]
    store.truncate_after(conv.id, first.id)
    assert [m.content for m in store.get_messages(conv.id)] == ["1"]
    store.delete_conversation(conv.id)
    with pytest.raises(NotFoundError):
        store.get_conversation(conv.id)
    assert store.get_messages(conv.id) == []  # cascaded


def test_fail_interrupted_marks_only_streaming_answers(store: Store) -> None:
    conv = store.create_conversation(
        "t", [NewMessage("user", "q"), NewMessage("assistant", "half", STREAMING)]
    )
    assert store.fail_interrupted("stopped early") == 1
    answer = store.get_messages(conv.id)[1]
    assert (answer.status, answer.error, answer.content) == (ERROR, "stopped early", "half")


def test_title_from_first_line_shortened_on_a_word() -> None:
    assert title_from("\n  Hello there \nsecond") == "Hello there"
    assert title_from("") == "New chat"
    long = "word " * 30
    title = title_from(long)
    assert title.endswith("…") and len(title) <= 61 and not title[:-1].endswith(" ")


def test_concurrent_writes_from_threads(store: Store) -> None:
    errors: list[BaseException] = []

    def writer(n: int) -> None:
        try:
            for i in range(25):
                conv = store.create_conversation(f"t{n}-{i}", [NewMessage("user", f"{n}-{i}-0")])
                store.add_messages(conv.id, [NewMessage("assistant", f"{n}-{i}-1")])
                store.update_message(store.get_messages(conv.id)[1].id, content=f"{n}-{i}-1!")
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    conversations = store.list_conversations(limit=1000)
    assert len(conversations) == 8 * 25
    for conv in conversations:
        n, i = conv.title[1:].split("-")
        assert [m.content for m in store.get_messages(conv.id)] == [f"{n}-{i}-0", f"{n}-{i}-1!"]


def test_restart_keeps_everything(tmp_path: Path) -> None:
    path = tmp_path / "c.sqlite3"
    first = Store(path)
    conv = first.create_conversation("kept", [NewMessage("user", "hello")], temperature=0.1)
    first.close()
    second = Store(path)
    assert second.get_conversation(conv.id).temperature == 0.1
    assert [m.content for m in second.get_messages(conv.id)] == ["hello"]
    second.close()


_WRITER = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    from localchat.chats.records import NewMessage
    from localchat.chats.store import Store
    store = Store(Path(sys.argv[1]))
    i = 0
    while True:
        store.create_conversation(f"c{i}", [NewMessage("user", "x" * 2000)] * 3 + [NewMessage("assistant", "y" * 5000)])
        i += 1
        if i == 20:
            print("ready", flush=True)
    """
)


def test_sigkill_during_writes_leaves_a_consistent_database(tmp_path: Path) -> None:
    path = tmp_path / "c.sqlite3"
    proc = subprocess.Popen([sys.executable, "-c", _WRITER, str(path)], cwd=REPO, stdout=subprocess.PIPE)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == b"ready"
        time.sleep(0.3)  # let it get well into more transactions
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
    assert proc.returncode == -signal.SIGKILL
    store = Store(path)
    assert store._query("PRAGMA integrity_check")[0][0] == "ok"
    conversations = store.list_conversations(limit=100_000)
    assert len(conversations) >= 20
    for conv in conversations:  # each conversation was one transaction: all four messages or none
        assert [m.role for m in store.get_messages(conv.id)] == ["user", "user", "user", "assistant"]
    store.close()


def _user_version(path: Path) -> int:
    db = sqlite3.connect(path)
    try:
        return int(db.execute("PRAGMA user_version").fetchone()[0])
    finally:
        db.close()


def test_a_database_of_the_current_schema_is_migrated_and_keeps_its_data(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "c.sqlite3"
    old = Store(path)
    conv = old.create_conversation("kept", [NewMessage("user", "hello"), NewMessage("assistant", "hi!")])
    old.close()
    current = schema_version()
    assert _user_version(path) == current
    # The next schema change, as a developer would add it: one appended migration.
    next_migration = (
        "ALTER TABLE messages ADD COLUMN rating INTEGER NOT NULL DEFAULT 0;"
        " CREATE INDEX messages_by_rating ON messages (rating)"
    )
    monkeypatch.setattr(store_schema, "MIGRATIONS", [*store_schema.MIGRATIONS, next_migration])
    new = Store(path)
    try:
        assert _user_version(path) == current + 1
        assert [(m.role, m.content) for m in new.get_messages(conv.id)] == [
            ("user", "hello"),
            ("assistant", "hi!"),
        ]
        new.add_messages(conv.id, [NewMessage("user", "after the upgrade")])
        rows = new._query("SELECT content, rating FROM messages ORDER BY id")
        assert [tuple(r) for r in rows] == [("hello", 0), ("hi!", 0), ("after the upgrade", 0)]
    finally:
        new.close()
    Store(path).close()  # opening again runs nothing twice
    assert _user_version(path) == current + 1


def test_a_failed_migration_leaves_the_database_unchanged(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "c.sqlite3"
    old = Store(path)
    conv = old.create_conversation("kept", [NewMessage("user", "hello")])
    old.close()
    broken = "ALTER TABLE messages ADD COLUMN half TEXT; ALTER TABLE nowhere ADD COLUMN x TEXT"
    monkeypatch.setattr(store_schema, "MIGRATIONS", [*store_schema.MIGRATIONS, broken])
    with pytest.raises(DatabaseSchemaError, match=rf"schema {schema_version()} failed.*left as it was"):
        Store(path)
    monkeypatch.undo()
    assert _user_version(path) == schema_version()
    again = Store(path)
    try:
        assert [m.content for m in again.get_messages(conv.id)] == ["hello"]
        columns = [r[1] for r in again._query("PRAGMA table_info(messages)")]
        assert "half" not in columns
    finally:
        again.close()


def test_a_database_from_a_newer_localchat_is_refused_with_a_message(tmp_path: Path) -> None:
    path = tmp_path / "c.sqlite3"
    db = sqlite3.connect(path)
    db.execute("PRAGMA user_version=7")
    db.close()
    with pytest.raises(DatabaseSchemaError, match="newer localchat") as err:
        Store(path)
    assert str(path) in err.value.message


@pytest.mark.parametrize("had_model_column", [False, True])
def test_version_1_databases_get_messages_model_once(tmp_path: Path, had_model_column: bool) -> None:
    """Migration 1 -> 2 adds messages.model; some version-1 databases got it early, without a bump."""
    path = tmp_path / "c.sqlite3"
    db = sqlite3.connect(path)
    initial = store_schema.MIGRATIONS[0]
    assert isinstance(initial, str)
    for statement in initial.split(";"):
        if statement.strip():
            db.execute(statement)
    if had_model_column:
        db.execute("ALTER TABLE messages ADD COLUMN model TEXT")
    db.execute("INSERT INTO conversations VALUES ('c1', 'old', '', '', NULL, NULL, NULL, 0, 0)")
    db.execute(
        "INSERT INTO messages (conversation_id, role, content, created_at) VALUES ('c1', 'user', 'hi', 0)"
    )
    db.execute("PRAGMA user_version=1")
    db.commit()
    db.close()
    store = Store(path)
    try:
        assert _user_version(path) == schema_version() >= 2
        (message,) = store.get_messages("c1")
        assert (message.content, message.model) == ("hi", None)
    finally:
        store.close()
