"""The project reads nothing outside its own checkout: a user's clone has nothing beside it."""

import os
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Spelled in pieces so that this file does not match itself.
OUTSIDE = ["../" + "shared", '"..", "' + 'shared"', "parents[2] / " + '"shared"']


def tracked_files():
    try:
        out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout (an installed copy has no tracked files to check)")
    return [f for f in out.decode().split("\0") if f]


def test_no_tracked_file_refers_outside_the_checkout():
    offenders = []
    for rel in tracked_files():
        path = os.path.join(ROOT, rel)
        if not os.path.isfile(path):
            continue
        with open(path, "rb") as f:
            text = f.read().decode("utf-8", errors="replace")
        offenders += [f"{rel}: {pat}" for pat in OUTSIDE if pat in text]
    assert not offenders, "files that point outside the checkout:\n" + "\n".join(offenders)


def test_golden_data_is_in_the_project():
    golden = os.path.join(ROOT, "tests", "golden")
    for name in ("smollm2-135m-instruct-q4_1.json", "gemma3-270m-q4_k_m.json", "botchan_a.txt", "README.md"):
        assert os.path.getsize(os.path.join(golden, name)) > 1000, name


def test_readme_links_resolve():
    import re

    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        readme = f.read()
    links = re.findall(r"\]\(([^)#:]+)\)", readme)
    assert "docs/architecture.md" in links
    missing = [link for link in links if not os.path.exists(os.path.join(ROOT, link))]
    assert not missing, missing
