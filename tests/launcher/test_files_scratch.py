"""The launcher's scratch directories without tempfile and shutil (launcher/files.py, issue 32): made where
tempfile.mkdtemp makes them, private, and removed whole without following a link out of them."""

from __future__ import annotations

import os
import stat

from trainhook.launcher import files


def test_a_private_directory_is_made_under_tmpdir_for_this_user_only(tmp_path, monkeypatch):
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    made = {files.private_directory("trainhook-launch-") for _ in range(20)}
    assert len(made) == 20
    for path in made:
        assert os.path.dirname(path) == str(tmp_path) and os.path.basename(path).startswith("trainhook-launch-")
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o700 and os.path.isdir(path)


def test_a_place_that_cannot_take_one_passes_to_the_next_as_tempfile_does(tmp_path, monkeypatch):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    monkeypatch.setenv("TMPDIR", str(blocker / "under"))  # ENOTDIR: the next place
    monkeypatch.setenv("TEMP", str(tmp_path / "missing"))  # ENOENT: the next place
    monkeypatch.setenv("TMP", str(tmp_path))
    path = files.private_directory("p-")
    assert os.path.dirname(path) == str(tmp_path), path


def test_with_no_variable_it_is_made_in_tmp(monkeypatch):
    for name in files.TEMPORARY_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    path = files.private_directory("trainhook-test-")
    try:
        assert os.path.dirname(path) == "/tmp"
    finally:
        os.rmdir(path)


def test_remove_tree_removes_a_deep_tree_and_never_follows_a_link_out(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep.txt").write_text("the user's")
    root = tmp_path / "scratch"
    deep = root
    for _ in range(300):  # a training's nested output
        deep = deep / "d"
    deep.mkdir(parents=True)
    (deep / "error.json").write_text("{}")
    (root / "file").write_text("x")
    (root / "link-to-outside").symlink_to(outside, target_is_directory=True)
    (root / "d" / "dangling").symlink_to(tmp_path / "nowhere")
    files.remove_tree(str(root))
    assert not root.exists() and not os.path.lexists(root)
    assert (outside / "keep.txt").read_text() == "the user's"


def test_remove_tree_of_what_is_not_there_is_quiet(tmp_path):
    files.remove_tree(str(tmp_path / "never-made"))
