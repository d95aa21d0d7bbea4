"""Package data: models/*.toml and tuned/<model>/tp<T>.json, shipped with the wheel (DESIGN.md §6)."""
