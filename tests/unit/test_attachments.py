"""Attachments without a server: what a file is, PDF and text extraction, truncation, the content-addressed
files, the store's schema 5 (migration, cleanup on delete) and export/import with the pictures."""

from __future__ import annotations

import base64
import io
import json
import sqlite3
from pathlib import Path

import pytest
from PIL import Image

from localchat.attachments.kinds import AttachmentError, document_kind, image_kind
from localchat.attachments.prepare import AttachmentRules, Upload, prepare
from localchat.attachments.text import TRUNCATION_NOTE, context_block, extract_text, fit
from localchat.chats.conversation_io import import_json, to_json
from localchat.chats.records import NewMessage
from localchat.chats.store import Store
from localchat.chats.store_schema import MIGRATIONS, schema_version
from tests.helpers.tiny_pdf import tiny_pdf


def png(color: tuple[int, int, int] = (200, 30, 30), size: int = 8) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (size, size), color).save(out, "PNG")
    return out.getvalue()


RULES = AttachmentRules("tiny-vlm", True, 4096, max_images=2, max_image_bytes=1 << 20)


def test_file_kinds_come_from_the_bytes_and_refuse_svg_and_binaries() -> None:
    assert image_kind(png()) is not None and image_kind(png()).media_type == "image/png"  # type: ignore[union-attr]
    assert image_kind(b"RIFF\0\0\0\0WEBPVP8 ").media_type == "image/webp"  # type: ignore[union-attr]
    assert image_kind(b"<svg xmlns='http://www.w3.org/2000/svg'/>") is None
    assert document_kind("a.pdf", tiny_pdf("x")) == "pdf"
    assert document_kind("notes.md", "# Héllo".encode()) == "text"
    with pytest.raises(AttachmentError, match="SVG"):
        document_kind("logo.svg", b"<svg xmlns='http://www.w3.org/2000/svg'/>")
    with pytest.raises(AttachmentError, match="SVG"):
        document_kind("logo.txt", b"  <svg onload='x'/>")
    with pytest.raises(AttachmentError, match="binary file"):
        document_kind("app.exe", b"MZ\x90\x00\x03\x00\x00\x00")
    with pytest.raises(AttachmentError, match="not a PNG"):
        document_kind("photo.png", b"not really a png")


def test_pdf_and_text_extraction() -> None:
    assert (
        extract_text("a.pdf", "pdf", tiny_pdf("First line", "Second (line)")) == "First line\nSecond (line)"
    )
    assert extract_text("a.txt", "text", b"one\r\ntwo") == "one\ntwo"
    with pytest.raises(AttachmentError, match="could not be read as a PDF"):
        extract_text("broken.pdf", "pdf", b"%PDF-1.4\nnonsense")


def test_truncation_cuts_on_a_line_and_the_block_says_so() -> None:
    text = "\n".join(f"line {i:04d}" for i in range(1000))
    cut, truncated = fit(text, 500)
    assert truncated and len(cut) <= 500 and cut.endswith(tuple("0123456789")), "cut at a line's end"
    assert fit("short", 500) == ("short", False)
    block = context_block("data.csv", cut, True)
    assert block.startswith("File: data.csv\n```\n") and block.endswith(TRUNCATION_NOTE)
    # A fence inside the file cannot close the block.
    assert context_block("x.md", "```\ncode\n```", False).startswith("File: x.md\n````\n")


def test_prepare_checks_everything_before_keeping_anything(tmp_path: Path) -> None:
    store = Store(tmp_path / "c.sqlite3")
    text_only = AttachmentRules("smollm2", False, 4096, 2, 1 << 20)
    with pytest.raises(AttachmentError, match=r"smollm2 does not see images, so cat\.png"):
        prepare([Upload("notes.txt", b"hi"), Upload("cat.png", png())], store.files, text_only)
    with pytest.raises(AttachmentError, match="up to 2 pictures"):
        prepare([Upload(f"{i}.png", png((i, 0, 0))) for i in range(3)], store.files, RULES)
    with pytest.raises(AttachmentError, match="binary file"):
        prepare([Upload("cat.png", png()), Upload("a.bin", b"\x00\x01\x02")], store.files, RULES)
    assert not (tmp_path / "attachments").exists(), "a refused message keeps no file"
    small = AttachmentRules("smollm2", False, 1000, 2, 1 << 20)  # 1000 tokens: documents share ~1500 chars
    got = prepare(
        [Upload("big.txt", b"word " * 2000), Upload("doc.pdf", tiny_pdf("PDF text"))], store.files, small
    )
    assert [(a.kind, a.name, a.truncated) for a in got] == [
        ("document", "big.txt", True),
        ("document", "doc.pdf", False),
    ]
    assert got[1].text == "PDF text" and got[1].media_type == "application/pdf"


def test_pictures_are_files_by_hash_and_leave_with_their_last_message(tmp_path: Path) -> None:
    store = Store(tmp_path / "c.sqlite3")
    red, blue = png(), png((0, 0, 200))
    [a_red, a_blue] = prepare([Upload("red.png", red), Upload("blue.png", blue)], store.files, RULES)
    [a_red_again] = prepare([Upload("same red.png", red)], store.files, RULES)
    one = store.create_conversation("one", [NewMessage("user", "look", attachments=[a_red, a_blue])])
    two = store.create_conversation("two", [NewMessage("user", "again", attachments=[a_red_again])])
    files = sorted(p.name for p in (tmp_path / "attachments").iterdir())
    assert len(files) == 2 and all(len(name.split(".")[0]) == 64 for name in files)
    [message] = store.get_messages(one.id)
    assert [a.name for a in message.attachments] == ["red.png", "blue.png"]
    assert store.read_image(message.attachments[0]) == red
    row = (
        sqlite3.connect(tmp_path / "c.sqlite3")
        .execute("SELECT max(length(text)) FROM attachments")
        .fetchone()
    )
    assert row[0] is None, "pictures are not stored in the database"

    store.delete_conversation(one.id)  # blue is gone; red is still used by conversation two
    assert sorted(p.name for p in (tmp_path / "attachments").iterdir()) == [message.attachments[0].file_name]
    [kept] = store.get_messages(two.id)
    store.truncate_after(two.id, kept.id, inclusive=True)
    assert list((tmp_path / "attachments").iterdir()) == []


def test_schema_4_database_is_migrated_to_5(tmp_path: Path) -> None:
    path = tmp_path / "c.sqlite3"
    db = sqlite3.connect(path)
    for migration in MIGRATIONS[:4]:
        if callable(migration):
            migration(db)
        else:
            db.executescript(migration)
    db.execute("INSERT INTO conversations (id, title, created_at, updated_at) VALUES ('c1', 'old', 0, 0)")
    db.execute(
        "INSERT INTO messages (conversation_id, role, content, created_at) VALUES ('c1', 'user', 'hi', 0)"
    )
    db.execute("PRAGMA user_version=4")
    db.commit()
    db.close()
    assert schema_version() >= 5  # later migrations (e.g. 5 -> 6, speculation stats) run on too
    store = Store(path)
    [message] = store.get_messages("c1")
    assert message.content == "hi" and message.attachments == []
    assert sqlite3.connect(path).execute("PRAGMA user_version").fetchone()[0] == schema_version()


def test_export_carries_pictures_and_documents_and_import_restores_them(tmp_path: Path) -> None:
    store = Store(tmp_path / "a" / "c.sqlite3")
    picture = png((10, 200, 10))
    attachments = prepare(
        [Upload("leaf.png", picture), Upload("notes.md", b"# Notes\nsee leaf")], store.files, RULES
    )
    conv = store.create_conversation("leaf", [NewMessage("user", "what is it?", attachments=attachments)])
    exported = json.dumps(to_json(conv, store.get_messages(conv.id), store.read_image))
    store.delete_conversation(conv.id)
    assert list((tmp_path / "a" / "attachments").iterdir()) == []

    other = Store(tmp_path / "b" / "c.sqlite3")  # another machine's data dir
    restored = import_json(other, exported)
    [message] = other.get_messages(restored.id)
    image, document = message.attachments
    assert (image.kind, image.name, image.media_type) == ("image", "leaf.png", "image/png")
    assert other.read_image(image) == picture
    assert (document.name, document.text, document.truncated) == ("notes.md", "# Notes\nsee leaf", False)

    bad = json.loads(exported)
    bad["messages"][0]["attachments"][0]["data"] = "PHN2Zz48L3N2Zz4="  # base64 of "<svg></svg>"
    bad["messages"][0]["attachments"].insert(
        0, {"kind": "image", "name": "new.png", "data": base64.b64encode(png((1, 2, 3))).decode()}
    )
    with pytest.raises(Exception, match="not a PNG, JPEG, GIF or WebP"):
        import_json(other, json.dumps(bad))
    assert len(list((tmp_path / "b" / "attachments").iterdir())) == 1, "a refused import writes no file"


def test_the_prompt_shows_the_newest_pictures_and_names_the_rest(tmp_path: Path) -> None:
    from types import SimpleNamespace

    from localchat.chats.history import chat_messages
    from localchat.chats.turns import stored_pictures

    store = Store(tmp_path / "c.sqlite3")
    red, blue = png(), png((0, 0, 200))
    first = prepare([Upload("red.png", red), Upload("notes.txt", b"hello")], store.files, RULES)
    second = prepare([Upload("blue.png", blue)], store.files, RULES)
    conv = store.create_conversation(
        "pics", [NewMessage("user", "one", attachments=first), NewMessage("user", "two", attachments=second)]
    )
    history = store.get_messages(conv.id)
    folder = tmp_path / "vlm"
    folder.mkdir()
    (folder / "config.json").write_text(
        json.dumps({"model_type": "gemma3", "vision_config": {"image_size": 896}})
    )
    ctx = SimpleNamespace(
        settings=SimpleNamespace(max_images_per_request=1), model=SimpleNamespace(path=folder)
    )
    pictures = stored_pictures(store, history, ctx)  # type: ignore[arg-type]
    one, two = chat_messages(conv, history, pictures=pictures)
    # Only one picture per request here: the newest is shown, the older one is named.
    assert (
        one["content"]
        == "File: notes.txt\n```\nhello\n```\n\n[Picture red.png: an earlier picture, not shown again]\n\none"
    )
    assert two["content"] == [{"type": "text", "text": "two"}, {"type": "image_bytes", "data": blue}]
    ctx.model.path = tmp_path  # a text-only model: every picture is named
    pictures = stored_pictures(store, history, ctx)  # type: ignore[arg-type]
    assert pictures is None
    _, two = chat_messages(conv, history, pictures=pictures)
    assert two["content"] == "[Picture blue.png: not shown, this model does not see images]\n\ntwo"
