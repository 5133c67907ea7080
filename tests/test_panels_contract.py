"""Every panel in widgets/ keeps the contract of widgets.base.Panel (the browser test relies on it):
it builds with its defaults, has controls, shows a chart with data, redraws when a control changes,
and has a short, stable text repr for nbval."""
import importlib
import inspect
import pkgutil

import pytest

import widgets
from widgets.base import Panel


def _panel_classes():
    found = []
    for mod in pkgutil.iter_modules(widgets.__path__):
        if mod.name in ("base", "chart_data"):
            continue
        module = importlib.import_module(f"widgets.{mod.name}")
        for _, cls in inspect.getmembers(module, inspect.isclass):
            if issubclass(cls, Panel) and cls is not Panel and cls.__module__ == module.__name__:
                found.append(cls)
    return found


PANELS = _panel_classes()


def test_there_are_panels():
    assert PANELS, "widgets/ should hold at least one Panel"


@pytest.mark.parametrize("cls", PANELS, ids=lambda c: c.__name__)
def test_panel_contract(cls):
    p = cls()
    assert "kit-panel" in p.root._dom_classes
    assert p._controls and all(hasattr(c, "value") for c in p._controls if hasattr(c, "observe"))
    assert p.chart_data(), "the chart shows no data"
    data, _ = p._repr_mimebundle_()
    assert data["text/plain"] == repr(p) and "\n" not in data["text/plain"]
    # changing a control redraws the chart in place
    before = p.chart.to_dict()
    for control in p._controls:
        options = getattr(control, "options", None)
        if options and len(options) > 1:
            values = [o[1] if isinstance(o, tuple) else o for o in options]
            control.value = next(v for v in values if v != control.value)
            break
    else:
        pytest.skip(f"{cls.__name__} has no dropdown to change")
    assert p.chart_widget.chart is p.chart
    assert p.chart.to_dict() != before


def test_offline_bundle_is_cached_and_reused(tmp_path, monkeypatch):
    import altair as alt

    from widgets.base import BUNDLE_MARK, _sha256, enable_offline_charts

    monkeypatch.setenv("KIT_CACHE", str(tmp_path))
    monkeypatch.setattr(alt.JupyterChart, "_is_offline", False)
    monkeypatch.setattr(alt.JupyterChart, "_esm", alt.JupyterChart._esm)
    enable_offline_charts()
    (bundle,) = tmp_path.glob("jupyterchart-*.js")
    assert bundle.read_text().startswith(alt.JupyterChart._esm + BUNDLE_MARK) and alt.JupyterChart._is_offline
    # the next kernel reads the cache instead of rebuilding (a whole one: it ends with its hash)
    bundle.write_text("// cached bundle" + BUNDLE_MARK + _sha256("// cached bundle") + "\n")
    monkeypatch.setattr(alt.JupyterChart, "_is_offline", False)
    enable_offline_charts()
    assert alt.JupyterChart._esm == "// cached bundle"
