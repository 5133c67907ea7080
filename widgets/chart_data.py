"""Read the data rows out of an altair chart (layered, concatenated or single), for tests."""
from __future__ import annotations


def chart_rows(chart) -> list[dict]:
    """Every inline data row of the chart spec, from top-level datasets and inline values."""
    spec = chart.to_dict()
    rows: list[dict] = []
    for values in spec.get("datasets", {}).values():
        rows.extend(values)

    def walk(node):
        if isinstance(node, dict):
            data = node.get("data")
            if isinstance(data, dict) and isinstance(data.get("values"), list):
                rows.extend(data["values"])
            for v in node.values():
                walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)

    walk({k: v for k, v in spec.items() if k != "datasets"})
    return rows
