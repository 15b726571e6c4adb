"""The cold-start baselines file: where it lives, what it holds, and that a broken one breaks nothing."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import pytest

from llmchat.core.observe._baselines import MAX_SAMPLES, MAX_TRACKS, BaselineStore, default_state_dir
from llmchat.core.observe._coldstart import Baseline, ColdStartDetector


def test_the_file_lives_in_the_xdg_state_folder(tmp_path: Path) -> None:
    assert default_state_dir({"XDG_STATE_HOME": str(tmp_path), "HOME": "/h"}) == tmp_path / "llmchat"
    # Unset, empty or relative: ~/.local/state, as the XDG spec says.
    for env in ({"HOME": "/h"}, {"XDG_STATE_HOME": "", "HOME": "/h"}, {"XDG_STATE_HOME": "x", "HOME": "/h"}):
        assert default_state_dir(env) == Path("/h/.local/state/llmchat")
    # The tests' own isolation (conftest) covers it: no test writes the real user's state.
    assert BaselineStore().path == Path(os.environ["XDG_STATE_HOME"]) / "llmchat" / "coldstart.json"


def test_a_round_trip_keeps_each_window_and_only_names_and_numbers(tmp_path: Path) -> None:
    store = BaselineStore(tmp_path / "state" / "coldstart.json")
    assert store.load() == []  # no file yet: an empty store, no warning
    saved = [Baseline("local", "llmchat-local", {"server": (301.0, 300.5), "client": (320.25,)}, 1.7e9,
                      "127.0.0.1:8000")]
    assert store.save(saved)
    assert store.load() == saved
    assert (store.path.stat().st_mode & 0o777) == 0o600
    assert [p.name for p in store.path.parent.iterdir()] == ["coldstart.json"]  # no temporary file left
    raw = json.loads(store.path.read_text())
    track = {"provider": "local", "model": "llmchat-local", "host": "127.0.0.1:8000",
             "server": [301.0, 300.5], "client": [320.25], "last_end": 1.7e9}
    assert raw == {"version": 1, "tracks": [track]}


def test_save_merges_with_what_another_process_wrote_and_the_newer_wins(tmp_path: Path) -> None:
    path = tmp_path / "coldstart.json"
    BaselineStore(path).save([Baseline("a", "m", {"client": (10.0,)}, 100.0),
                              Baseline("b", "m", {"client": (20.0,)}, 100.0)])
    BaselineStore(path).save([Baseline("a", "m", {"client": (11.0,)}, 200.0),
                              Baseline("b", "m", {"client": (99.0,)}, 50.0)])
    got = {b.provider: b for b in BaselineStore(path).load()}
    assert got["a"].samples == {"client": (11.0,)} and got["b"].samples == {"client": (20.0,)}


def test_the_file_stays_small(tmp_path: Path) -> None:
    store = BaselineStore(tmp_path / "coldstart.json")
    many = [Baseline("p", f"model-{i}", {"client": tuple(float(x) for x in range(500))}, float(i))
            for i in range(3 * MAX_TRACKS)]
    many.append(Baseline("p", "x" * 10_000, {"client": (1.0,)}, 1e12))  # an absurd name is not kept
    assert store.save(many)
    kept = store.load()
    assert len(kept) == MAX_TRACKS and all(len(b.samples["client"]) == MAX_SAMPLES for b in kept)
    assert {b.model for b in kept} == {f"model-{i}" for i in range(2 * MAX_TRACKS, 3 * MAX_TRACKS)}  # newest
    assert store.path.stat().st_size < 64 * 1024


@pytest.mark.parametrize(
    "content",
    [b"{not json", b"\xff\xfe", b"[]", b'{"version": 99, "tracks": []}', b'{"version": 1, "tracks": {}}',
     b"x" * (2 << 20)],
)
def test_a_corrupt_file_is_ignored_with_one_warning_and_healed_on_save(
    tmp_path: Path, content: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "coldstart.json"
    path.write_bytes(content)
    store = BaselineStore(path)
    with caplog.at_level(logging.WARNING, logger="llmchat.coldstart"):
        assert store.load() == [] and store.load() == []
        assert store.save([Baseline("p", "m", {"client": (5.0,)}, 1.0)])
    assert len(caplog.records) == 1 and str(path) in caplog.records[0].getMessage()
    assert BaselineStore(path).load() == [Baseline("p", "m", {"client": (5.0,)}, 1.0)]


def test_entries_that_make_no_sense_are_skipped_one_by_one(tmp_path: Path) -> None:
    path = tmp_path / "coldstart.json"
    path.write_text(json.dumps({"version": 1, "tracks": [
        "nope", {"provider": 1, "model": "m"}, {"provider": "p", "model": "m"},
        {"provider": "p", "model": "ok", "client": [10, "x", -1, 1e400, True, 12.5], "server": "no",
         "last_end": "z"},
    ]}))
    assert BaselineStore(path).load() == [Baseline("p", "ok", {"client": (10.0, 12.5)}, None)]


def test_an_unwritable_place_is_one_warning_never_an_exception(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    store = BaselineStore(blocker / "llmchat" / "coldstart.json")  # a folder where a file is
    with caplog.at_level(logging.WARNING, logger="llmchat.coldstart"):
        assert store.load() == []
        assert not store.save([Baseline("p", "m", {"client": (1.0,)}, 1.0)])
        assert not store.save([Baseline("p", "m", {"client": (1.0,)}, 1.0)])
    assert len(caplog.records) == 1 and "Not a directory" in caplog.records[0].getMessage()


async def test_from_a_loop_it_goes_through_the_executor_and_seeds_a_detector(tmp_path: Path) -> None:
    store = BaselineStore(tmp_path / "coldstart.json")
    old = ColdStartDetector()
    old.seed([Baseline("p", "m", {"server": (20.0, 21.0, 22.0)}, 5.0)])
    assert await store.asave(old.baselines())
    new = ColdStartDetector()
    new.seed(await store.aload())
    assert new.median("p", "m", "server") == 21.0
