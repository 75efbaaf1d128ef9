"""Presets (system prompt + sampling) and app settings in the conversation store, and the migration
that adds their tables to a database of the previous schema with its conversations kept."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from localchat.chats import store_schema
from localchat.chats.records import NewMessage, Preset
from localchat.chats.store import Store


def test_presets_and_settings_round_trip(tmp_path: Path) -> None:
    store = Store(tmp_path / "c.sqlite3")
    try:
        assert store.list_presets() == [] and store.get_setting("default_system_prompt") == ""
        store.save_preset(Preset("terse", "Answer in one line.", temperature=0.2, max_tokens=64))
        store.save_preset(Preset("Creative", "", temperature=1.1, top_p=0.9))
        store.save_preset(Preset("terse", "Answer in one sentence.", temperature=0.3))  # replaces
        presets = {p.name: p for p in store.list_presets()}
        assert [p.name for p in store.list_presets()] == ["Creative", "terse"]
        assert (
            presets["terse"].system_prompt == "Answer in one sentence."
            and presets["terse"].max_tokens is None
        )
        assert presets["Creative"].top_p == 0.9
        store.delete_preset("Creative")
        assert [p.name for p in store.list_presets()] == ["terse"]
        store.set_setting("default_system_prompt", "Be kind.")
        store.set_setting("default_system_prompt", "Be brief.")
        assert store.get_setting("default_system_prompt") == "Be brief."
    finally:
        store.close()


def test_a_schema_2_database_gains_the_tables_and_keeps_its_chats(tmp_path: Path) -> None:
    path = tmp_path / "c.sqlite3"
    db = sqlite3.connect(path)
    for migration in store_schema.MIGRATIONS[:2]:  # the schema as the previous release left it
        if callable(migration):
            migration(db)
        else:
            db.executescript(migration)
    db.execute("PRAGMA user_version=2")
    db.execute(
        "INSERT INTO conversations (id, title, created_at, updated_at) VALUES ('abc', 'old chat', 1, 1)"
    )
    db.commit()
    db.close()
    store = Store(path)
    try:
        assert store.get_conversation("abc").title == "old chat"
        store.add_messages("abc", [NewMessage("user", "still here")])
        store.save_preset(Preset("p"))
        assert [p.name for p in store.list_presets()] == ["p"]
        check = sqlite3.connect(path)
        assert check.execute("PRAGMA user_version").fetchone()[0] == store_schema.schema_version() >= 3
        check.close()
    finally:
        store.close()


def test_regenerate_keeps_every_version_and_any_can_come_back(tmp_path: Path) -> None:
    store = Store(tmp_path / "c.sqlite3")
    try:
        conv = store.create_conversation("t", [NewMessage("user", "hi"), NewMessage("assistant", "first")])
        first = store.get_messages(conv.id)[-1]
        second = store.regenerate_answer(conv.id, first.id)
        store.update_message(second.id, content="second", status="done")
        third = store.regenerate_answer(conv.id, second.id)
        store.update_message(third.id, content="third", status="done")
        messages = store.get_messages(conv.id)
        assert [m.content for m in messages] == ["hi", "third"]  # one answer in the chat
        assert (messages[-1].alternatives, messages[-1].earlier_versions) == (2, 2)
        assert [a.content for a in store.alternatives(third.id)] == ["first", "second"]
        oldest = store.alternatives(third.id)[0]
        back = store.use_alternative(third.id, oldest.id)
        assert back.content == "first" and (back.alternatives, back.earlier_versions) == (2, 0)
        assert sorted(a.content for a in store.alternatives(third.id)) == ["second", "third"]
        store.delete_message(conv.id, third.id)  # the versions go with their answer
        assert store.alternatives(third.id) == []
    finally:
        store.close()
