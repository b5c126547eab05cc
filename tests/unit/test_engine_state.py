"""sglang_engine_state: what the engine role decides restarts from, read in one module run."""

from repo_module import REPO, load

state = load("sglang_engine_state", REPO / "roles/sglang_engine/library/sglang_engine_state.py")


def test_current_release_names_the_release_current_points_at(tmp_path):
    (tmp_path / "releases" / "0.5.23-abc").mkdir(parents=True)
    (tmp_path / "current").symlink_to("releases/0.5.23-abc")
    assert state.current_release(str(tmp_path)) == "0.5.23-abc"


def test_current_release_is_empty_without_a_link(tmp_path):
    assert state.current_release(str(tmp_path)) == ""
    (tmp_path / "current").mkdir()
    assert state.current_release(str(tmp_path)) == ""


def test_read_text_strips_and_tolerates_a_missing_file(tmp_path):
    (tmp_path / "engine-decode-0.release").write_text("0.5.23-abc\n")
    assert state.read_text(str(tmp_path / "engine-decode-0.release")) == "0.5.23-abc"
    assert state.read_text(str(tmp_path / "engine-prefill-0.release")) == ""


def test_known_instances_joins_loaded_units_and_enabled_links():
    units = [
        "sglang-engine@decode-0.service loaded active running SGLang engine decode-0",
        "sglang-engine@old-1.service loaded inactive dead SGLang engine old-1",
        "",
    ]
    wants = ["sglang-engine@old-2.service", "sglang-engine@decode-0.service", "ssh.service"]
    assert state.known_instances(units, wants) == [
        "sglang-engine@decode-0.service", "sglang-engine@old-1.service", "sglang-engine@old-2.service"]
