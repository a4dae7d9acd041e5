"""The saved-plans store: names, persistence, atomic writes, and what happens to broken files."""

from __future__ import annotations

import json
import os
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import pytest

from hwdash.core.plan import Method, Plan
from hwdash.core.plans.store import (
    MAX_NAME_LENGTH,
    PlanStore,
    PlanStoreError,
    PlanSummary,
    default_plans_path,
)
from hwdash.errors import UsageError

LORA = Plan(model="qwen2.5-7b", method=Method.LORA, batch=4, seq=1024)
FULL = Plan(model="qwen2.5-7b", method=Method.FULL, batch=1, seq=4096, zero=2)


@pytest.fixture
def store(tmp_path: Path) -> PlanStore:
    return PlanStore(tmp_path / "data" / "hwdash" / "plans.json")


def test_default_path_follows_xdg_data_home(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    assert default_plans_path() == tmp_path / "xdg" / "hwdash" / "plans.json"
    assert PlanStore().path == tmp_path / "xdg" / "hwdash" / "plans.json"
    monkeypatch.delenv("XDG_DATA_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    fallback = tmp_path / "home" / ".local" / "share" / "hwdash" / "plans.json"
    assert default_plans_path() == fallback
    monkeypatch.setenv("XDG_DATA_HOME", "relative/dir")  # invalid per the XDG spec: ignored
    assert default_plans_path() == fallback


def test_missing_file_is_an_empty_store(store: PlanStore) -> None:
    assert store.list() == []
    assert store.get("anything") is None
    assert not store.path.exists()


def test_save_survives_a_new_store_object(store: PlanStore) -> None:
    summary = PlanSummary(
        model_name="Qwen2.5-7B",
        memory={"weights": 100, "gradients": 0, "total": 100},
        gpus=1,
        best_flavor="a10g-large",
        hours=1.5,
        cost=2.25,
    )
    saved = store.save("qwen lora", LORA, summary=summary)
    assert saved.name == "qwen lora"
    again = PlanStore(store.path)
    [loaded] = again.list()
    assert loaded.name == "qwen lora"
    assert loaded.plan == LORA
    assert loaded.plan.method is Method.LORA
    assert loaded.summary == summary
    assert loaded.summary is not None and loaded.summary.per_gpu_total == 100
    assert loaded.saved_at.tzinfo is not None
    data = json.loads(store.path.read_text())
    assert data["format"] == "hwdash-plans"
    assert data["version"] == 1
    assert data["plans"][0]["plan"]["method"] == "lora"


def test_taken_name_gets_a_suffix_unless_overwrite(store: PlanStore) -> None:
    store.save("run", LORA)
    second = store.save("run", FULL)
    third = store.save("run", FULL)
    assert (second.name, third.name) == ("run (2)", "run (3)")
    assert store.names() == ["run", "run (2)", "run (3)"]
    assert store.unique_name("run") == "run (4)"
    replaced = store.save("run", FULL, overwrite=True)
    assert replaced.name == "run"
    assert store.names() == ["run", "run (2)", "run (3)"]
    got = store.get("run")
    assert got is not None and got.plan == FULL


def test_names_are_cleaned_and_checked(store: PlanStore) -> None:
    saved = store.save("  qwen   lora \n", LORA)
    assert saved.name == "qwen lora"
    assert store.get(" qwen lora ") is not None
    with pytest.raises(PlanStoreError, match="needs a name"):
        store.save("   ", LORA)
    with pytest.raises(PlanStoreError, match="at most"):
        store.save("x" * (MAX_NAME_LENGTH + 1), LORA)


def test_rename(store: PlanStore) -> None:
    store.save("a", LORA)
    store.save("b", FULL)
    renamed = store.rename("a", "qwen small")
    assert renamed.plan == LORA
    assert store.names() == ["qwen small", "b"]
    with pytest.raises(PlanStoreError, match="already exists"):
        store.rename("qwen small", "b")
    with pytest.raises(PlanStoreError, match="no saved plan named 'zzz'"):
        store.rename("zzz", "c")
    # Renaming to the same name is allowed and changes nothing.
    store.rename("b", "b")
    assert store.names() == ["qwen small", "b"]


def test_remove(store: PlanStore) -> None:
    store.save("a", LORA)
    store.save("b", FULL)
    removed = store.remove("a")
    assert removed.plan == LORA
    assert store.names() == ["b"]
    with pytest.raises(PlanStoreError, match="no saved plan"):
        store.remove("a")


def test_two_store_objects_see_each_other(store: PlanStore) -> None:
    other = PlanStore(store.path)
    store.save("a", LORA)
    other.save("a", FULL)
    assert store.names() == ["a", "a (2)"]


def test_write_is_atomic_and_leaves_no_temp_files(
    store: PlanStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    store.save("a", LORA)
    before = store.path.read_text()

    def failing_replace(src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", failing_replace)
    with pytest.raises(PlanStoreError, match="No space left on device"):
        store.save("b", FULL)
    monkeypatch.undo()
    assert store.path.read_text() == before
    leftovers = [p.name for p in store.path.parent.iterdir() if p.name.endswith(".tmp")]
    assert leftovers == []


@pytest.mark.parametrize(
    ("content", "reason"),
    [
        ("{not json", "not valid JSON"),
        ('["a", "list"]', "not a hwdash plans file"),
        ('{"format": "something-else", "version": 1, "plans": []}', "not a hwdash plans file"),
        ('{"format": "hwdash-plans", "version": 0, "plans": []}', "format version 0"),
        ('{"format": "hwdash-plans", "version": "2", "plans": []}', "format version '2'"),
        (
            '{"format": "hwdash-plans", "version": 1, "plans": [{"name": "x", "plan": {"model": ""},'
            ' "saved_at": "2026-01-01T00:00:00Z"}]}',
            "bad entry at plans.0.plan.model",
        ),
    ],
)
def test_a_broken_file_is_read_as_it_is_and_moved_aside_only_by_a_write(
    store: PlanStore, content: str, reason: str
) -> None:
    store.path.parent.mkdir(parents=True)
    store.path.write_text(content)
    # Reads say where the file is and what is wrong, and never move it.
    for read in (store.list, store.names, lambda: store.get("x"), lambda: store.unique_name("x")):
        with pytest.raises(PlanStoreError, match=reason) as caught:
            read()
        assert caught.value.backup is None
        assert str(store.path) in str(caught.value) and "left as it is" in str(caught.value)
        assert isinstance(caught.value, UsageError)
    assert store.path.read_text() == content
    assert list(store.path.parent.glob("plans.json.bak-*")) == []
    # A write moves it aside, says where, and the list starts afresh.
    with pytest.raises(PlanStoreError, match=reason) as caught:
        store.save("new", LORA)
    backup = caught.value.backup
    assert backup is not None
    assert backup.name.startswith("plans.json.bak-")
    assert backup.read_text() == content
    assert str(backup) in str(caught.value)
    assert store.list() == []
    store.save("new", LORA)
    assert store.names() == ["new"]
    assert backup.read_text() == content


def test_two_backups_in_the_same_second_do_not_collide(store: PlanStore) -> None:
    store.path.parent.mkdir(parents=True)
    backups = []
    for text in ("{broken one", "{broken two", "{broken three"):
        store.path.write_text(text)
        with pytest.raises(PlanStoreError) as caught:
            store.remove("x")
        backups.append(caught.value.backup)
    assert len(set(backups)) == 3
    assert sorted(b.read_text() for b in backups if b) == sorted(
        ["{broken one", "{broken two", "{broken three"]
    )


def test_unreadable_file_is_not_moved(store: PlanStore) -> None:
    store.path.mkdir(parents=True)  # a folder where the file should be
    with pytest.raises(PlanStoreError, match="cannot be read"):
        store.list()
    assert store.path.is_dir()


def _save_many(path: str, worker: int, count: int) -> None:
    store = PlanStore(path)
    for index in range(count):
        store.save("run", LORA.model_copy(update={"batch": worker * 100 + index + 1}))


def test_concurrent_writers_lose_no_plan(store: PlanStore) -> None:
    workers, each = 6, 10
    with ProcessPoolExecutor(max_workers=workers) as pool:
        jobs = [pool.submit(_save_many, str(store.path), w, each) for w in range(workers)]
        for job in jobs:
            job.result()
    plans = store.list()
    assert len(plans) == workers * each
    assert len({p.name for p in plans}) == workers * each
    assert sorted(p.plan.batch for p in plans) == sorted(
        w * 100 + i + 1 for w in range(workers) for i in range(each)
    )


def test_a_file_from_a_newer_hwdash_is_never_moved_or_overwritten(store: PlanStore) -> None:
    newer = '{"format": "hwdash-plans", "version": 7, "plans": [{"name": "future"}]}'
    store.path.parent.mkdir(parents=True)
    store.path.write_text(newer)
    for attempt in (store.list, lambda: store.save("mine", LORA), lambda: store.remove("future")):
        with pytest.raises(PlanStoreError, match="newer hwdash") as caught:
            attempt()
        assert caught.value.backup is None
        assert store.path.read_text() == newer
    assert [p.name for p in store.path.parent.iterdir() if ".bak-" in p.name] == []


def test_the_cli_refuses_to_save_into_a_newer_file_with_exit_2(
    store: PlanStore, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from hwdash.cli import main

    monkeypatch.setenv("XDG_DATA_HOME", str(store.path.parent.parent))

    newer = '{"format": "hwdash-plans", "version": 2, "plans": []}'
    store.path.parent.mkdir(parents=True)
    store.path.write_text(newer)
    status = main(["plan", "--model", "qwen2.5-0.5b", "--save", "x"])
    err = capsys.readouterr().err
    assert status == 2 and "newer hwdash" in err
    assert store.path.read_text() == newer
