"""speculators' own trainer (`speculators train`, vllm-project/speculators 0.9), run on a CPU in one process: its
`main` unchanged, with the three places where it assumes a GPU pointed at the CPU. Run with the peers' environment's
python (benchmarks/trainer_vs_field.sh); the arguments are speculators' own.

    PEERS/bin/python benchmarks/speculators_train_cpu.py --verifier-name-or-path DIR --data-path DIR ...
"""

import sys
import time

import torch

import speculators.train.checkpointer as checkpointer
import speculators.train.trainer as trainer
from speculators.train.cli import main
from speculators.train.config.schema import TrainConfig

trainer.get_local_rank = lambda: "cpu"  # it moves the model and each batch `.to(local_rank)`
checkpointer.get_current_device = lambda: "cpu"  # where it loads a checkpoint to resume
if torch.accelerator.current_accelerator() is None:
    torch.accelerator.synchronize = lambda *args, **kwargs: None  # its step timer waits for a GPU that is not there
    _init = trainer.Trainer.__init__

    def _on_cpu(self, *args, **kwargs):
        _init(self, *args, **kwargs)
        self.device_type = "cpu"  # (it falls back to "cuda" when no accelerator is found)

    trainer.Trainer.__init__ = _on_cpu

if __name__ == "__main__":
    start = time.perf_counter()
    main(TrainConfig.resolve(sys.argv[1:]))
    print(f"speculators training: {time.perf_counter() - start:.1f} s in all", flush=True)
