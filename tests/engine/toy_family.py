"""A fourth model family, whole in this file: least squares on a fixed random problem, one unit = one SGD step.

Used by ``test_trainer.py`` to prove once, for every family, what ``engine/trainer.run`` owns: resume equals the
uninterrupted run, the fail and save points, the summary. Each step adds noise from torch's global RNG to the
gradient, so a resume that did not restore the RNG would not reproduce the uninterrupted run.

Run as a script (``python toy_family.py CKPT_DIR UNITS [FAIL_AT]``) it trains with checkpoints every 2 units; with
FAIL_AT it dies at that unit as a killed process would (the loop's fault point).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

import torch

from haloflow.engine.checkpoint import CheckpointConfig, cpu_state
from haloflow.engine.runtime import RuntimeConfig, TrainResult
from haloflow.engine.trainer import Exported, run


@dataclass(frozen=True)
class ToyStep:
    step: int
    loss: float

    def progress(self) -> dict[str, float]:
        return {"loss": self.loss}

    def record(self) -> dict:
        return {"kind": "step", "step": self.step, "loss": self.loss}


@dataclass(eq=False)
class ToyResult(TrainResult):
    losses: list[float] | None = None
    resumed_at: int = 0


class ToyFamily:
    kind, unit, more_flag, join = "toy", "step", "--units", False
    adapts_threads = True

    def __init__(self, units: int, width: int = 4, lr: float = 0.1):
        self.units, self.width, self.lr = units, width, lr
        self.losses: list[float] = []
        self.begun_at: int | None = None

    def setup(self, rt) -> None:
        g = torch.Generator().manual_seed(0)
        self.a = torch.randn(32, self.width, generator=g)
        self.b = torch.randn(32, generator=g)
        self.w = torch.zeros(self.width, requires_grad=True)
        self.opt = torch.optim.SGD([self.w], lr=self.lr, momentum=0.9)

    def total_units(self) -> int:
        return self.units

    def identity(self) -> dict:
        return {"width": self.width}

    def export(self) -> Exported:
        return Exported({"w": self.w.detach().clone(), "optimizer": self.opt.state_dict(), "losses": self.losses})

    def restore(self, loaded) -> None:
        with torch.no_grad():
            self.w.copy_(loaded.state["w"])
        self.opt.load_state_dict(loaded.state["optimizer"])
        self.losses = list(loaded.state["losses"])

    def begin(self, done: int) -> None:
        self.begun_at = done

    def train_unit(self, index: int) -> ToyStep:
        loss = ((self.a @ self.w - self.b) ** 2).mean()
        self.opt.zero_grad()
        loss.backward()
        self.w.grad += 0.01 * torch.randn(self.width)  # the global RNG: restored by the loop on resume
        self.opt.step()
        self.losses.append(float(loss.detach()))
        return ToyStep(index + 1, self.losses[-1])

    def finish(self) -> None:
        pass

    def evaluate(self, run_info) -> dict[str, float]:
        return {"final_loss": float(((self.a @ self.w.detach() - self.b) ** 2).mean())}

    def result(self, run_info, metrics) -> ToyResult:
        return ToyResult(**run_info.base(), state_dict=cpu_state({"w": self.w.detach()}), losses=self.losses,
                         resumed_at=run_info.resumed_at)


def train_toy(units: int, *, checkpoint: CheckpointConfig | None = None, log_jsonl=None) -> ToyResult:
    torch.manual_seed(123)  # the noise stream; a resumed run gets its state from the checkpoint instead
    runtime = RuntimeConfig(device="cpu", progress=False, log_jsonl=log_jsonl,
                            checkpoint=checkpoint or CheckpointConfig())
    return run(ToyFamily(units), runtime)


if __name__ == "__main__":
    ckpt, units = Path(sys.argv[1]), int(sys.argv[2])
    fail_at = int(sys.argv[3]) if len(sys.argv) > 3 else None
    train_toy(units, checkpoint=CheckpointConfig(dir=ckpt, every=2, keep=10, fail_at=fail_at))
