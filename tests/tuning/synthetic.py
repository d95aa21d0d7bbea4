"""A synthetic timer for tune's tests on a CPU: each knob set's launch has a true µs (a function of its knobs);
a sample is that µs with Gaussian noise, times a slow drift shared by every launch (clocks, heat), which the
A B B A rounds must cancel. The only fake part of those tests: the real studies, storage and keep rule run."""

from __future__ import annotations

import json
import time
from collections.abc import Callable

import numpy as np


class SyntheticEvaluator:
    def __init__(
        self,
        true_us: Callable[[dict], float],
        noise: float = 0.002,
        drift: float = 1e-4,
        seed: int = 0,
        reject: Callable[[dict], str | None] = lambda knobs: None,
        canonical: Callable[[dict], dict] = lambda knobs: knobs,
        sleep: float = 0.0,
    ) -> None:
        self.true_us, self.noise, self.drift = true_us, noise, drift
        self.rng = np.random.default_rng(seed)
        self.reject, self.canonical, self.sleep = reject, canonical, sleep
        self.samples = 0  # the shared clock of the drift
        self.timed: list[dict] = []  # every knob set a timer was made for, in order
        self.checked: list[dict] = []

    def identity(self, knobs: dict) -> str:
        return json.dumps(self.canonical(dict(knobs)), sort_keys=True, default=str)

    def check(self, knobs: dict) -> str | None:
        self.checked.append(dict(knobs))
        return self.reject(knobs)

    def timer(self, knobs: dict) -> Callable[[], float]:
        self.timed.append(dict(knobs))
        us = self.true_us(knobs)

        def sample() -> float:
            if self.sleep:
                time.sleep(self.sleep)
            self.samples += 1
            return us * (1 + self.drift * self.samples) * (1 + self.rng.normal(0, self.noise))

        return sample

    def release(self, knobs: dict) -> None:
        pass
