"""The drafter shipped for the default target, trained in one prepared command on a GPU, or as a long run on a CPU.

On a GPU (the second command of `payload.py`'s plan, when its first has left the payload's first part there):
  1. rebuild SmolLM2-135M-Instruct from the GGUF parts, checked against the SHA-256 of the fp32 weights users get;
  2. make the target's own greedy answers to ShareGPT prompts (the dev prompts left out) with the trainer's
     `--prepare-only`, growing the set part by part until --tokens or the data share of the clock;
  3. train each kind in --kinds with `training/distill.py` (concurrently: a small drafter leaves a GPU mostly idle),
     a short first call measuring its step time so that its cosine schedule ends when the clock does;
  4. measure the drafters on the dev prompts through the real loop (`hf-specdec bench`, k = 5, constant);
  5. leave in --out: `summary.json` (device, minutes, tokens, steps, the loss and acceptance curves, the dev figures),
     `log.txt`, each drafter as a tar (cut into 15 MiB pieces) and the answers' token ids.
Every stage runs against one clock (--minutes), so the command ends inside its limit with the best drafters written.

On a CPU the same command is the long run in the background: each sitting grows the answers for a share of its
minutes (the parts made earlier are kept), then continues the training from its last checkpoint (a larger set starts
a new run from the previous run's best drafter).

    python benchmarks/gpu/payload.py pack                                              # here, once
    python benchmarks/gpu/train_shipped.py --payload .gpu --out "$OUT" --minutes 8.5   # on the GPU
    python benchmarks/gpu/train_shipped.py --device cpu --kinds new --minutes 120      # the CPU run; resumes
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import lzma
import os
import platform
import shutil
import signal
import subprocess
import sys
import tarfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.gpu import payload  # noqa: E402
from hf_specdec.errors import InputError  # noqa: E402

PIECE = 15 * 2**20  # what comes back: files of at most 16 MiB, at most 8 of them, 64 MiB in all
MAX_FILES, MAX_BYTES = 8, 60 * 2**20


@dataclass
class Sizes:
    """How large each stage's batches are on a device; chosen once from --device (--tiny: CI's check)."""

    gen_batch: int  # prompts answered at once
    part: int  # prompts per saved part of the answers (the unit by which the set grows)
    train_batch: int  # sequences per training step
    calibration_steps: int  # the first call's steps, which measure the step time
    eval_prompts: int  # held-out prompts of the trainer's own evals
    dev_prompts: int  # dev prompts of the final measurement
    dev_new_tokens: int
    data_share: float  # of the minutes left after the target is built, at most this share makes answers
    dev_seconds: float  # kept at the end for the dev-prompt measurement
    max_new_tokens: int = 256
    max_prompt_tokens: int = 256
    heldout: int = 32
    seconds_per_eval: float = 20.0  # a guess for the first plan; the log's measured figure replaces it


SIZES = {
    "cuda": Sizes(gen_batch=1024, part=2048, train_batch=64, calibration_steps=40, eval_prompts=16, dev_prompts=10,
                  dev_new_tokens=128, data_share=0.4, dev_seconds=90.0),
    "cpu": Sizes(gen_batch=32, part=64, train_batch=16, calibration_steps=6, eval_prompts=8, dev_prompts=0,
                 dev_new_tokens=128, data_share=0.5, dev_seconds=0.0, seconds_per_eval=60.0),
    "tiny": Sizes(gen_batch=8, part=8, train_batch=4, calibration_steps=3, eval_prompts=2, dev_prompts=1,
                  dev_new_tokens=8, data_share=0.4, dev_seconds=30.0, max_new_tokens=12, max_prompt_tokens=64, heldout=2,
                  seconds_per_eval=1.0),
}

#: each kind's options: the token-only drafter measured best per CPU-hour; EAGLE-3 reads the target's states, computed
#: per batch on the device (--online-features), with one training-time-test pass for its first third
KIND_OPTIONS = {
    "new": ["--num-hidden-layers", "2"],
    "eagle3": ["--online-features", "--ttt-steps", "3"],
    "block": ["--online-features"],
}


class Clock:
    def __init__(self, minutes: float):
        self.start = time.time()
        self.end = self.start + 60 * minutes

    def left(self) -> float:
        return self.end - time.time()

    def elapsed(self) -> float:
        return time.time() - self.start


class Report:
    """summary.json and log.txt in --out, rewritten as the stages go (a command killed at its limit still returns
    what was done)."""

    def __init__(self, out: Path, clock: Clock):
        self.out, self.clock, self.summary = out, clock, {"stages": {}}
        out.mkdir(parents=True, exist_ok=True)

    def log(self, message: str) -> None:
        line = f"[{self.clock.elapsed():7.1f} s] {message}"
        print(line, flush=True)
        with open(self.out / "log.txt", "a") as f:
            f.write(line + "\n")

    def stage(self, name: str, **facts) -> None:
        self.summary["stages"].setdefault(name, {}).update(facts)
        self.write()

    def write(self) -> None:
        tmp = self.out / "summary.json.tmp"
        tmp.write_text(json.dumps(self.summary, indent=2, default=str))
        os.replace(tmp, self.out / "summary.json")


def run(command: list[str], log_path: Path, deadline: float, env: dict | None = None) -> int:
    """Run `command` (output to `log_path`) until it ends or the deadline: then SIGTERM, SIGKILL 20 s later. Its status
    (-9/-15 when stopped)."""
    with open(log_path, "a") as log:
        log.write(f"$ {' '.join(map(str, command))}\n")
        log.flush()
        process = subprocess.Popen([str(c) for c in command], cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                                   env=env or os.environ.copy(), process_group=0)  # (its own group, this session)
        try:
            return process.wait(timeout=max(1.0, deadline - time.time()))
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGTERM)
            try:
                return process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                return process.wait()


def tail(path: Path, lines: int = 15) -> str:
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:]) if path.exists() else ""


class ShippedRun:
    """The stages, in order, against one clock."""

    def __init__(self, args, report: Report, clock: Clock):
        self.args, self.report, self.clock = args, report, clock
        self.sizes = SIZES["tiny" if args.tiny else "cuda" if args.device.startswith("cuda") else "cpu"]
        self.work = Path(args.work).expanduser()
        self.work.mkdir(parents=True, exist_ok=True)
        self.logs = self.work / "logs"
        self.logs.mkdir(exist_ok=True)
        self.env = {**os.environ, "PYTHONUNBUFFERED": "1", "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1",
                    "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
        self.kinds = [k for k in args.kinds.split(",") if k]
        self.margin = 2.0 if args.tiny else 10.0  # seconds kept at the very end: the outputs written, the clock ends
        self.prompts, self.target = args.prompts, args.target
        if args.tiny and args.target == "default":  # the trainer tests' offline world: a tiny random target and chats
            from tests.distill_world import build_tiny_world

            world = self.work / "tiny-world"
            if not (world / "dev.jsonl").exists():  # (made once: the files' dates key the answers made from them)
                build_tiny_world(world)
            self.target, self.prompts = str(world / "target"), str(world / "data.jsonl")
            args.exclude_ids = args.dev_prompts = str(world / "dev.jsonl")

    # 1. the target --------------------------------------------------------------------------------------------------
    def rebuild_target(self) -> None:
        """From the payload (`payload.rebuild_target`): `--target default` then means the checked SmolLM2 here and in
        every process this one starts."""
        facts = payload.rebuild_target(Path(self.args.payload), self.work)
        self.env["HF_SPECDEC_CACHE"] = facts["cache"]
        if facts["site"]:  # (the carried `gguf` wheel, for the trainer's processes too)
            self.env["PYTHONPATH"] = os.pathsep.join([facts["site"], self.env["PYTHONPATH"]])
        self.target, self.prompts = "default", facts["prompts"]
        self.report.stage("target", **{k: facts[k] for k in ("weights_sha256", "gguf_sha256", "prompt_count")},
                          seconds=round(self.clock.elapsed(), 1))

    # 2. the target's own answers ------------------------------------------------------------------------------------
    def data_args(self, num_generate: int) -> list[str]:
        s = self.sizes
        return ["--target", self.target, "--data", self.prompts, "--exclude-ids", self.args.exclude_ids,
                "--teacher-data", "generate", "--num-generate", str(num_generate), "--max-new-tokens", str(s.max_new_tokens),
                "--max-prompt-tokens", str(s.max_prompt_tokens), "--heldout-prompts", str(s.heldout),
                "--gen-batch-size", str(s.gen_batch), "--prepare-part-size", str(s.part),
                "--data-cache-dir", str(self.work / "data"), "--dtype", "float32"]

    def data_meta(self, num_generate: int) -> dict | None:
        from hf_specdec.training.arguments import parse_args
        from hf_specdec.training.prepare import data_cache_key

        args, _ = parse_args(self.data_args(num_generate))
        done = self.work / "data" / data_cache_key(args) / "meta.json"
        return json.loads(done.read_text()) if done.exists() else None

    def make_answers(self) -> int:
        """Grow the answers part by part until --tokens, the data share of the clock, or the prompts run out; the
        --num-generate of the set made (its parts stay for a larger set in a later sitting)."""
        s, state_file = self.sizes, self.work / "data_state.json"
        state = json.loads(state_file.read_text()) if state_file.exists() else {"num_generate": 0, "curve": []}
        deadline = time.time() + s.data_share * self.clock.left()
        n = state["num_generate"] or s.part
        while True:
            meta = self.data_meta(n)
            if meta is None:
                started, before = time.time(), state["num_generate"]
                status = run([sys.executable, "training/distill.py", "--prepare-only", *self.data_args(n),
                              "--output-dir", str(self.work / "prepare"), "--overwrite"],
                             self.logs / "answers.log", deadline, self.env)
                meta = self.data_meta(n)
                if meta is None:  # stopped by the clock (its finished parts are kept) or failed
                    self.report.log(f"answers for {n} prompts not finished (status {status}): {tail(self.logs / 'answers.log', 3)}")
                    if not state["num_generate"]:
                        raise RuntimeError(f"no answers made: see {self.logs / 'answers.log'}")
                    meta = self.data_meta(state["num_generate"])
                    break
                throughput = meta["throughput"]["self_generation"]
                state["curve"].append({"num_generate": n, "target_tokens": meta["train_target_tokens"],
                                       "seconds": round(time.time() - started, 1),
                                       "generation_tokens_per_second": round(throughput["tokens_per_second_per_process"], 1)})
                self.report.log(f"answers: {n} prompts, {meta['train_target_tokens']} target tokens "
                                f"({time.time() - started:.0f} s)")
                state["num_generate"] = n
                state_file.write_text(json.dumps(state, indent=2))
                rate = (n - before) / max(time.time() - started, 1e-9)  # prompts per second, start-up included
            else:
                state["num_generate"], rate = n, None
            tokens, records = meta["train_target_tokens"], meta["train_records"]
            if tokens >= self.args.tokens or records < n - s.heldout - 1:  # enough, or every prompt is answered
                break
            per_prompt = tokens / max(records, 1)
            wanted = (self.args.tokens - tokens) / per_prompt
            affordable = (rate or s.part / 60) * (deadline - time.time()) * 0.85
            more = int(min(wanted + s.part, affordable) // s.part * s.part)
            if more < s.part:
                break
            n += more
        self.report.stage("answers", num_generate=state["num_generate"], target_tokens=meta["train_target_tokens"],
                          records=meta["train_records"], curve=state["curve"], throughput=meta["throughput"],
                          seconds_total=round(self.clock.elapsed(), 1))
        return state["num_generate"]

    # 3. training --------------------------------------------------------------------------------------------------
    def train_args(self, kind_or_folder: str, kind: str) -> list[str]:
        s = self.sizes
        cuda = self.args.device.startswith("cuda")
        extra = ["--num-hidden-layers", "1"] if self.args.tiny and kind == "new" else KIND_OPTIONS.get(kind, [])
        threads = max(1, (os.cpu_count() or 1) // len(self.kinds)) if cuda else 0  # (concurrent kinds share the cores)
        return ["--drafter", kind_or_folder, *extra, "--batch-size", str(s.train_batch), "--threads", str(threads),
                "--learning-rate", str(self.args.learning_rate), "--warmup-steps", str(max(2, s.calibration_steps)),
                "--mixed-precision", "bf16" if cuda else "no", "--eval-prompts", str(s.eval_prompts),
                "--eval-max-new-tokens", "64" if not self.args.tiny else "8", "--num-draft-tokens", "5",
                "--log-every", str(max(1, s.calibration_steps // 4))]

    def train(self, kind: str, num_generate: int, deadline: float) -> dict:
        """One kind: a run per answer set (a larger set starts from the previous run's best drafter), its first call
        measuring the step time, the second ending its schedule at the deadline."""
        s = self.sizes
        out = self.work / "runs" / f"{kind}-n{num_generate}"
        record = out / "driver.json"
        log_path = self.logs / f"train-{kind}.log"
        if record.exists():
            base = json.loads(record.read_text())["argv"]
        else:
            earlier = sorted((p for p in (self.work / "runs").glob(f"{kind}-n*") if p != out
                              and (p / "checkpoints" / "best" / "config.json").exists()),
                             key=lambda p: int(p.name.rsplit("-n", 1)[1]))
            start_from = str(earlier[-1] / "checkpoints" / "best") if earlier else kind
            base = [*self.data_args(num_generate), *self.train_args(start_from, kind), "--output-dir", str(out)]
            out.mkdir(parents=True, exist_ok=True)
            record.write_text(json.dumps({"argv": base, "continued_from": start_from}))
        trainer = [sys.executable, "training/distill.py", *base]
        done = self.steps_done(out)
        if done == 0:  # calibration: a few steps (warm-up only), checkpointed, then resumed with the real horizon
            run([*trainer, "--max-steps", str(s.calibration_steps), "--eval-every", "0",
                 "--save-every", str(s.calibration_steps), "--resume"], log_path, deadline, self.env)
            done = self.steps_done(out)
            if done == 0:
                raise RuntimeError(f"{kind}: the first training call failed: {tail(log_path)}")
        rate, eval_seconds = self.measured(out)
        startup = 20.0 if not self.args.tiny else 5.0
        seconds = deadline - time.time() - startup - 2 * eval_seconds  # the mid-run eval and the final one
        steps = max(0, int(seconds / rate))  # (none: the call only evaluates and publishes what it has)
        run([*trainer, "--resume", "--max-steps", str(done + steps), "--eval-every", str((steps + 1) // 2),
             "--save-every", str(max(1, steps // 4)), "--time-budget", f"{max(seconds + eval_seconds, 1) / 3600:.5f}"],
            log_path, deadline, self.env)
        return self.describe(kind, out, log_path)

    @staticmethod
    def steps_done(out: Path) -> int:
        from hf_specdec.training.checkpoints import latest_checkpoint

        found = latest_checkpoint(out)
        return int(found.name.split("-")[1]) if found else 0

    def measured(self, out: Path) -> tuple[float, float]:
        """(seconds per step, seconds per eval) from the run's log: the steady rate between its last two train lines."""
        events = read_log(out)
        train = [e for e in events if e.get("event") == "train"]
        rate = train[-1]["seconds_per_step"] if train else 1.0
        if len(train) >= 2 and train[-1].get("steps_run", 0) > train[-2].get("steps_run", 0):
            # (seconds_per_step is elapsed / steps run in that call: the difference of two lines is the steady rate,
            # without the first steps' warm-up)
            a, b = train[-2], train[-1]
            rate = (b["seconds_per_step"] * b["steps_run"] - a["seconds_per_step"] * a["steps_run"]) / (b["steps_run"] - a["steps_run"])
        evals = [e["eval_seconds"] for e in events if e.get("event") == "eval" and "eval_seconds" in e]
        return max(rate, 1e-3), (evals[-1] if evals else self.sizes.seconds_per_eval)

    def describe(self, kind: str, out: Path, log_path: Path) -> dict:
        events = read_log(out)
        best = self.best_folder(out)
        train = [e for e in events if e.get("event") == "train"]
        train = train[:: max(1, len(train) // 200)] + train[-1:]  # (at most about 200 points)
        facts = {"output_dir": str(out), "steps": self.steps_done(out),
                 "loss_curve": [{k: e.get(k) for k in ("step", "loss", "top1", "seconds_per_step", "target_tokens_per_second")}
                                for e in train],
                 "eval_curve": [{k: e.get(k) for k in ("step", "mean_accepted_tokens", "acceptance_by_position", "heldout_top1")}
                                for e in events if e.get("event") == "eval"],
                 "best_folder": str(best) if best else None,
                 "continued_from": json.loads((out / "driver.json").read_text()).get("continued_from")}
        start = next((e for e in events if e.get("event") == "start"), {})
        facts["train_target_tokens"] = start.get("train_target_tokens")
        if not best:
            facts["error"] = tail(log_path)
        return facts

    @staticmethod
    def best_folder(out: Path) -> Path | None:
        """The published drafter (the run finished), else its best checkpoint."""
        from hf_specdec.training.checkpoints import best_folder

        return out if (out / "model.safetensors").exists() and (out / "config.json").exists() else best_folder(out)

    def train_all(self, num_generate: int) -> dict:
        kinds = self.kinds
        deadline = self.clock.end - self.sizes.dev_seconds - self.margin
        if self.args.device.startswith("cuda"):  # concurrently: each kind's own deadline is the clock's
            with concurrent.futures.ThreadPoolExecutor(len(kinds)) as pool:
                futures = {k: pool.submit(self.train, k, num_generate, deadline) for k in kinds}
                results = {k: self.settle(k, f) for k, f in futures.items()}
        else:  # in turn, sharing the time
            results = {}
            for i, kind in enumerate(kinds):
                share = time.time() + (deadline - time.time()) / (len(kinds) - i)
                results[kind] = self.settle(kind, None, lambda: self.train(kind, num_generate, share))
        self.report.stage("training", kinds=results, seconds_total=round(self.clock.elapsed(), 1))
        return results

    def settle(self, kind: str, future, call=None) -> dict:
        try:
            result = future.result() if future is not None else call()
            self.report.log(f"{kind}: {result['steps']} steps; evals {[round(e['mean_accepted_tokens'], 3) for e in result['eval_curve']]}")
            return result
        except Exception as error:  # one kind's failure leaves the others' drafters
            self.report.log(f"{kind}: failed: {error}")
            return {"error": str(error)}

    # 4. the dev prompts -------------------------------------------------------------------------------------------
    def measure_dev(self, trained: dict) -> None:
        folders = [r["best_folder"] for r in trained.values() if r.get("best_folder")]
        if not folders or not self.sizes.dev_prompts or self.clock.left() < self.sizes.dev_seconds / 3:
            return
        path = self.work / "dev.json"
        path.unlink(missing_ok=True)
        status = run([sys.executable, "-m", "hf_specdec.cli", "bench", "--target", self.target,
                      "--assistant", ",".join(folders), "--prompts", self.args.dev_prompts,
                      "--num-prompts", str(self.sizes.dev_prompts), "--max-new-tokens", str(self.sizes.dev_new_tokens),
                      "--num-draft-tokens", "5", "--device", self.args.device, "--json", str(path)],
                     self.logs / "dev.log", self.clock.end - self.margin, self.env)
        result = json.loads(path.read_text()) if path.exists() else {"error": f"status {status}: {tail(self.logs / 'dev.log')}"}
        self.report.stage("dev_prompts", result=result)

    # 5. what comes back -------------------------------------------------------------------------------------------
    def deliver(self, trained: dict, num_generate: int) -> None:
        """Each drafter as a tar (cut into pieces that come back), then the answers' token ids if room is left."""
        out, files = self.report.out, []
        for kind, result in trained.items():
            if result.get("best_folder"):
                tar = self.work / f"drafter-{kind}.tar"
                with tarfile.open(tar, "w") as t:
                    for item in sorted(Path(result["best_folder"]).iterdir()):
                        if item.name not in ("checkpoints",) and not item.name.endswith((".tmp", ".old")):
                            t.add(item, arcname=f"drafter-{kind}/{item.name}")
                files += self.pieces(tar)
        answers = self.answers_file(num_generate)
        if answers is not None:
            files.append(answers)
        used, count, delivered = sum(p.stat().st_size for p in out.iterdir()), len(list(out.iterdir())) + 1, []
        for path in files:
            size = path.stat().st_size
            if count + 1 > MAX_FILES or used + size > MAX_BYTES:
                self.report.log(f"left behind (no room): {path.name}")
                continue
            shutil.copy(path, out / path.name)
            used, count = used + size, count + 1
            delivered.append(path.name)
        self.report.stage("delivered", files=delivered)

    def pieces(self, path: Path) -> list[Path]:
        if path.stat().st_size <= PIECE:
            return [path]
        pieces = []
        with open(path, "rb") as f:
            for i, block in enumerate(iter(lambda: f.read(PIECE), b"")):
                piece = path.with_name(f"{path.name}.{i:02d}")
                piece.write_bytes(block)
                pieces.append(piece)
        path.unlink()
        return pieces

    def answers_file(self, num_generate: int) -> Path | None:
        """The answers' token ids (prompt and answer, uint16 when the vocabulary allows), xz-compressed numpy: a later
        run can score them instead of generating them again."""
        import io

        import numpy
        from safetensors.numpy import load_file

        from hf_specdec.training.arguments import parse_args
        from hf_specdec.training.prepare import data_cache_key

        args, _ = parse_args(self.data_args(num_generate))
        path = self.work / "data" / data_cache_key(args) / "train.safetensors"
        if not path.exists():
            return None
        tensors = load_file(str(path))
        tokens = tensors["tokens"]
        buffer = io.BytesIO()
        numpy.savez(buffer, tokens=tokens.astype(numpy.uint16) if tokens.max() < 2**16 else tokens,
                    tok_off=tensors["tok_off"], start=tensors["start"])
        result = self.work / "answers.npz.xz"
        result.write_bytes(lzma.compress(buffer.getvalue(), preset=6))
        return result

    # all of it ----------------------------------------------------------------------------------------------------
    def __call__(self) -> None:
        import torch

        device = {"device": self.args.device, "torch": torch.__version__, "python": platform.python_version()}
        if self.args.device.startswith("cuda"):
            device["name"] = torch.cuda.get_device_name()
        from importlib.metadata import version

        device["transformers"] = version("transformers")
        self.report.summary.update(device=device, minutes=self.args.minutes, tokens_goal=self.args.tokens,
                                   sizes=asdict(self.sizes), kinds=self.args.kinds)
        self.report.log(f"on {device.get('name', self.args.device)}, {self.args.minutes} minutes")
        if self.args.payload:
            self.rebuild_target()
            self.report.log("target rebuilt and checked")
        num_generate = self.make_answers()
        trained = self.train_all(num_generate)
        self.deliver(trained, num_generate)
        self.measure_dev(trained)
        self.report.stage("end", seconds_total=round(self.clock.elapsed(), 1))
        self.report.log("done")


def read_log(out: Path) -> list[dict]:
    path = out / "training_log.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--minutes", type=float, required=True, help="the whole command's clock; every stage ends inside it")
    p.add_argument("--out", default=None, help="summary, log, drafters, answers (default: WORK/out)")
    p.add_argument("--work", default="~/.cache/hf_specdec/shipped-run", help="data, runs and logs (kept: a rerun resumes)")
    p.add_argument("--payload", default=None, help="the folder `payload.py pack` wrote (.gpu): rebuild the target from it")
    p.add_argument("--target", default="default")
    p.add_argument("--prompts", default="sharegpt", help="the trainer's --data: 'sharegpt' or a JSON-lines file")
    p.add_argument("--exclude-ids", default="auto", help="the trainer's --exclude-ids ('auto': the dev prompts)")
    p.add_argument("--dev-prompts", default="dev", help="what the drafters are measured on (hf-specdec bench --prompts)")
    p.add_argument("--kinds", default="new,eagle3", help="drafter kinds to train, comma-separated")
    p.add_argument("--tokens", type=int, default=3_000_000, help="target tokens of answers to make, when the clock allows")
    p.add_argument("--learning-rate", type=float, default=1e-3)
    p.add_argument("--device", default="cuda")
    p.add_argument("--tiny", action="store_true", help="tiny sizes: the check CI runs on the CPU")
    args = p.parse_args(argv)
    if args.minutes <= 0:
        p.error("--minutes must be > 0")
    unknown = [k for k in args.kinds.split(",") if k and k not in KIND_OPTIONS]
    if unknown:
        p.error(f"--kinds: unknown {unknown} (known: {', '.join(KIND_OPTIONS)})")
    if args.device.startswith("cuda"):
        import torch

        if not torch.cuda.is_available():
            p.error("--device cuda, but torch sees no GPU here; pass --device cpu for the CPU run")
    return args


def main(argv=None) -> None:
    args = parse(argv)
    clock = Clock(args.minutes)
    out = Path(args.out).expanduser() if args.out else Path(args.work).expanduser() / "out"
    report = Report(out, clock)
    try:
        ShippedRun(args, report, clock)()
    except InputError as error:
        report.log(f"error: {error}")
        print(f"train_shipped: error: {error}", file=sys.stderr)
        sys.exit(2)
    except RuntimeError as error:  # a stage that made nothing: what it printed is in its log, named here
        report.log(f"failed: {error}")
        sys.exit(1)


if __name__ == "__main__":
    main()
