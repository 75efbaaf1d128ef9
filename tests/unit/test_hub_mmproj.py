"""`localchat pull` of a GGUF repo with vision projectors (fake hub, tests/helpers/fake_hub.py): the f16
mmproj comes with the model into its folder, counts in its size, is found by the loader's pairing, and
stays when another quant of the repo that shares it is removed."""

from __future__ import annotations

import os

from localchat import hub
from localchat.vision.mmproj import pair_mmproj
from tests.helpers.fake_hub import FakeHub

Q4 = os.urandom(70_000)
Q8 = os.urandom(110_000)
PROJ16 = os.urandom(9_000)
REPO = "org/Vision-GGUF"


def test_pull_fetches_the_f16_mmproj_beside_the_model(fake_hub: FakeHub) -> None:
    fake_hub.add_repo(REPO, {"model-Q4_K_M.gguf": Q4, "model-Q8_0.gguf": Q8, "mmproj-model-f16.gguf": PROJ16,
                             "mmproj-model-bf16.gguf": os.urandom(9_000), "README.md": b"# model\n"})  # fmt: skip
    q4 = hub.pull(REPO)
    projector = q4.path.parent / "mmproj-model-f16.gguf"
    assert [p.name for p in q4.files] == ["model-Q4_K_M.gguf", "mmproj-model-f16.gguf"]
    assert projector.read_bytes() == PROJ16 and not (q4.path.parent / "mmproj-model-bf16.gguf").exists()
    assert q4.path.name == "model-Q4_K_M.gguf" and q4.size_bytes == len(Q4) + len(PROJ16)
    assert pair_mmproj(q4.path) == projector  # the loader's pairing finds it beside the model
    q8 = hub.pull(f"{REPO}:Q8_0")
    assert [(m.name, m.size_bytes) for m in hub.list_local()] == [
        (f"{REPO}:Q4_K_M", len(Q4) + len(PROJ16)),
        (f"{REPO}:Q8_0", len(Q8) + len(PROJ16)),
    ]
    assert hub.remove(f"{REPO}:Q8_0") == len(Q8)  # the shared projector stays for Q4_K_M
    assert not q8.path.exists() and projector.read_bytes() == PROJ16
    assert [m.name for m in hub.list_local()] == [f"{REPO}:Q4_K_M"]
    assert hub.remove(f"{REPO}:Q4_K_M") == len(Q4) + len(PROJ16)
    assert hub.list_local() == []
