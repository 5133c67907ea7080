"""The chart bundle cached in $KIT_CACHE (widgets.base.enable_offline_charts) is used only when
whole: a file of invalid UTF-8 had raised UnicodeDecodeError from every panel's constructor, and
one cut short was served to the browser, which drew no chart. Either is rebuilt and rewritten."""
import altair as alt
import pytest

from widgets.base import _checked_bundle, enable_offline_charts

FRESH = "// a freshly built bundle"


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("KIT_CACHE", str(tmp_path))
    monkeypatch.setattr(alt.JupyterChart, "_is_offline", False)
    monkeypatch.setattr(alt.JupyterChart, "_esm", "")

    def build(cls=alt.JupyterChart):  # what altair's own bundling gives, without its seconds
        alt.JupyterChart._esm, alt.JupyterChart._is_offline = FRESH, True

    monkeypatch.setattr(alt.JupyterChart, "enable_offline", staticmethod(build))
    enable_offline_charts()  # writes the cache
    (bundle,) = tmp_path.glob("jupyterchart-*.js")
    monkeypatch.setattr(alt.JupyterChart, "_is_offline", False)
    alt.JupyterChart._esm = ""
    return bundle


@pytest.mark.parametrize("damage", ["undecodable", "cut", "edited", "empty"])
def test_damaged_bundle_is_rebuilt(cache, damage):
    whole = cache.read_bytes()
    cache.write_bytes({"undecodable": whole[:10] + b"\xff\xfe" + whole[10:],
                       "cut": whole[: len(whole) // 2],
                       "edited": whole.replace(b"freshly", b"FRESHLY"),
                       "empty": b""}[damage])
    assert _checked_bundle(cache) is None
    enable_offline_charts()  # no traceback
    assert alt.JupyterChart._esm == FRESH and alt.JupyterChart._is_offline
    assert _checked_bundle(cache) == FRESH  # and the cache is whole again


def test_whole_bundle_is_reused(cache, monkeypatch):
    monkeypatch.setattr(alt.JupyterChart, "enable_offline",
                        staticmethod(lambda: pytest.fail("rebuilt a whole cached bundle")))
    enable_offline_charts()
    assert alt.JupyterChart._esm == FRESH
