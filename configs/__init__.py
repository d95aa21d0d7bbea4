"""Package data: models/*.toml and tuned/<model>/tp<T>.json, shipped with the wheel (docs/design.md §6)."""
