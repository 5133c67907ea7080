"""kit validate lists the JSON files it does not read as labels (at another depth than
<GPU>/<label>.json) as skipped, with the reason, instead of passing them over unsaid."""
import pytest

from kit.cli import main
from kit.cli.cmd_validate import validate
from kit.errors import KitError

LABEL = '{"e2e_latency": 50, "fw_latency": 20, "bwall_latency": 30}'


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("KIT_CACHE", str(tmp_path / "cache"))


def _tree(root, names):
    for name in names:
        p = root / name
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(LABEL)
    return root


def test_json_at_another_depth_is_listed_as_skipped(tmp_path, capsys):
    # a model not in the zoo: skipped fast, for its own reason, and read
    root = _tree(tmp_path / "labels", ["Tesla_T4/nomodel-train-8-1.json", "gpt2-train-8-1.json",
                                       "Tesla_T4/sub/gpt2-train-8-2.json"])
    r = validate(root)
    by = {s["label"]: s["reason"] for s in r["skipped"]}
    assert set(by) == {"Tesla_T4/nomodel-train-8-1.json", "gpt2-train-8-1.json",
                       "Tesla_T4/sub/gpt2-train-8-2.json"}  # the last two had not been named at all
    assert "not in the zoo" in by["Tesla_T4/nomodel-train-8-1.json"]
    assert "label folder itself" in by["gpt2-train-8-1.json"]
    assert "2 folders deep" in by["Tesla_T4/sub/gpt2-train-8-2.json"]
    rc = main(["validate", "--labels", str(root)])
    out, err = capsys.readouterr()
    assert rc == 2 and "skipped gpt2-train-8-1.json: not read as a label" in out
    assert "skipped Tesla_T4/sub/gpt2-train-8-2.json: not read as a label" in out


def test_only_json_at_another_depth_is_one_error_naming_one(tmp_path):
    root = _tree(tmp_path / "labels", ["Tesla_T4/sub/gpt2-train-8-2.json"])
    with pytest.raises(KitError, match="no label files under .*1 JSON file\\(s\\) at another depth, "
                                       "e.g. Tesla_T4/sub/gpt2-train-8-2.json"):
        validate(root)


def test_unreadable_labels_beside_stray_json_are_still_one_error(tmp_path):
    # every label unreadable: the error names a label's reason, not a stray file's
    root = _tree(tmp_path / "labels", ["x.json"])
    (root / "Tesla_T4").mkdir()
    (root / "Tesla_T4" / "gpt2-train-8-1.json").write_text("{not json")
    with pytest.raises(KitError, match="none of the 1 label file\\(s\\) .*gpt2-train-8-1.json"):
        validate(root)
