"""``../shared/data/README.md``: the real users' prompts are read from there at run time and never
copied into the project (and audit challenges are never drawn from them: a cheating node holds
them too). Results that need to name a prompt keep its line number and a hash of its text."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PROMPTS = REPO.parent / "shared" / "data" / "user-prompts.jsonl"
MIN_CHARS = 24  # shorter prompts ("Who made Berlin") could occur in any text by chance


def tracked_files() -> list[Path]:
    out = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True).stdout
    return [REPO / name for name in out.decode().split("\0") if name]


def test_no_file_of_the_project_holds_a_users_prompt() -> None:
    if not PROMPTS.exists():
        pytest.skip(f"{PROMPTS} is not here (it sits beside the checkout, not in it)")
    texts = [json.loads(line)["prompt"] for line in PROMPTS.read_text().splitlines() if line.strip()]
    needles = {t for t in texts if len(t) >= MIN_CHARS}
    needles |= {json.dumps(t)[1:-1] for t in needles}  # as a JSON file would hold it
    assert len(texts) > 300 and needles
    found = []
    for path in tracked_files():
        try:
            content = path.read_text()
        except (UnicodeDecodeError, FileNotFoundError, IsADirectoryError):
            continue
        found += [f"{path.relative_to(REPO)}: {t[:40]!r}" for t in needles if t in content]
    assert not found, "users' prompts copied into the project (keep a line number and a hash):\n" + "\n".join(found)


def test_measured_audit_scores_name_their_prompts_by_line_and_hash() -> None:
    data = json.loads((REPO / "simulations" / "data" / "audit_scores.json").read_text())
    assert data["prompts"] and all(set(p) == {"line", "sha256"} and len(p["sha256"]) == 64 for p in data["prompts"])
