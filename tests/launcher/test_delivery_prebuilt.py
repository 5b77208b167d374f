"""The launcher image's prebuilt zip (issue 32): the init container copies it instead of building the zip in every
pod, but only while it is what building would give."""

from __future__ import annotations

from trainhook.launcher import deliver


def test_the_prebuilt_zip_is_the_zip_a_pod_would_build_and_install_copies_it(tmp_path, monkeypatch):
    prebuilt = deliver.write_prebuilt(tmp_path / "share" / deliver.ZIP_NAME)
    assert prebuilt.read_bytes() == deliver.build_zip()
    monkeypatch.setattr(deliver, "PREBUILT_ZIP", prebuilt)
    monkeypatch.setattr(deliver, "build_zip", lambda: b"built in the pod")
    deliver.install(tmp_path / "pod")
    assert (tmp_path / "pod" / deliver.ZIP_NAME).read_bytes() == prebuilt.read_bytes()


def test_a_stale_or_missing_prebuilt_zip_is_built_again(tmp_path, monkeypatch):
    prebuilt = deliver.write_prebuilt(tmp_path / "share" / deliver.ZIP_NAME)
    monkeypatch.setattr(deliver, "PREBUILT_ZIP", prebuilt)
    key = tmp_path / "share" / (deliver.ZIP_NAME + ".key")
    key.write_text("0" * 64)  # the modules changed after the image was built (a pip install over it)
    assert deliver.prebuilt_zip() is None
    deliver.install(tmp_path / "pod")
    assert (tmp_path / "pod" / deliver.ZIP_NAME).read_bytes() == deliver.build_zip()
    key.unlink()
    assert deliver.prebuilt_zip() is None
    monkeypatch.setattr(deliver, "PREBUILT_ZIP", tmp_path / "nowhere" / deliver.ZIP_NAME)
    assert deliver.prebuilt_zip() is None


def test_the_key_follows_every_in_pod_source(tmp_path, monkeypatch):
    before = deliver.sources_key()
    modules = deliver.in_pod_modules()
    changed = tmp_path / "changed.py"
    changed.write_bytes(modules[-1][1].read_bytes() + b"\n# changed\n")
    monkeypatch.setattr(deliver, "in_pod_modules", lambda: [*modules[:-1], (modules[-1][0], changed)])
    assert deliver.sources_key() != before
