"""Run torchtitan 0.3.0's own trainer on CPU with gloo, for tests/test_torchtitan_e2e.py.

Run with the torchtitan virtual environment's Python (``make torchtitan-venv``), never
imported by pp_opt or by the main test suite. Two commands:

``python torchtitan_launcher.py prepare DIR``
    Writes ``DIR/tests/assets/tokenizer`` (a byte-level BPE tokenizer trained with the
    ``tokenizers`` package) and ``DIR/tests/assets/c4_test/data.json`` (JSON lines of
    generated text): the paths torchtitan's llama3 debug config reads, made locally (the
    wheel ships neither, and the test has no network).

``torchrun --nproc-per-node N torchtitan_launcher.py run CASES.json OUT``
    Runs each case of CASES.json (a list of ``{"name": ..., "args": [...]}``, the args
    being torchtitan's own command line: ``--module/--config`` and overrides) one after
    the other in the same processes (torch and torchtitan are imported once), and writes
    ``OUT/NAME.json`` from the rank that holds the last stage: every step's loss (also as
    ``float.hex``, for bitwise comparison) and wall time.

Nothing in site-packages is edited. Before torchtitan's trainer is imported this module
patches, each for the reason given where it is done:

1. the device (torchtitan has no CPU switch);
2. FlexAttention (compiled with max-autotune, and refused on CPU for backward);
3. two torch APIs torchtitan 0.3.0 calls and torch 2.13.0 lacks (backports);
4. the trainer's 2-second sleep at the end of each run (test time only);
5. FSDP's gradient reduce-scatter on gloo (a sum where gloo lacks the pre-multiplied one).
"""

from __future__ import annotations

import json
import os
import random
import sys
import time
import types
from pathlib import Path
from typing import Any

# ---------------------------------------------------------------- assets (no torch needed)

_TEXT = (
    "pipeline stage schedule microbatch forward backward weight gradient memory device "
    "rank layer tensor loss step optimizer batch token sequence model train data time "
    "order split fused input output norm embedding head the a of to and in is on for with "
    "as by at from that this it be are was can will not one two three four five six seven"
)
_WORDS = _TEXT.split(" ")


def prepare(root: Path) -> None:
    """Write the tokenizer and the c4_test data set torchtitan's debug config reads."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    rng = random.Random(0)
    docs = []
    for _ in range(400):
        words = [rng.choice(_WORDS) for _ in range(rng.randint(150, 400))]
        docs.append(" ".join(words) + ".")
    assets = root / "tests" / "assets"
    data = assets / "c4_test"
    data.mkdir(parents=True, exist_ok=True)
    with open(data / "data.json", "w") as f:
        for text in docs:
            f.write(json.dumps({"text": text}) + "\n")

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    special = ["<|begin_of_text|>", "<|end_of_text|>"]
    trainer = trainers.BpeTrainer(vocab_size=512, special_tokens=special, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())  # fmt: skip
    tok.train_from_iterator(docs, trainer=trainer)
    folder = assets / "tokenizer"
    folder.mkdir(parents=True, exist_ok=True)
    tok.save(str(folder / "tokenizer.json"))
    config = {"bos_token": special[0], "eos_token": special[1], "add_bos_token": True,
              "add_eos_token": True}  # fmt: skip
    (folder / "tokenizer_config.json").write_text(json.dumps(config))


# ---------------------------------------------------------------- patches


def _patch_device() -> None:
    """1. torchtitan/tools/utils.py picks ``device_type = _get_available_device_type() or
    "cuda"`` at import time, with no flag or variable for CPU; Trainer then calls
    ``torch.cuda.set_device``. Set it to ``cpu`` (torchtitan's init_distributed then takes
    gloo, torch's default backend for CPU) with a shim that adds the memory-statistics calls
    its DeviceMemoryMonitor makes."""
    import torch
    import torchtitan.tools.utils as tt_utils  # imports only logging and observability

    class CpuDevice(types.ModuleType):
        def __getattr__(self, name: str) -> Any:
            return getattr(torch.cpu, name)

    shim = CpuDevice("torchtitan_cpu_device")
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    calls: dict[str, Any] = {
        "set_device": lambda *a, **k: None,
        "device_count": lambda: 1,
        "current_device": lambda: 0,
        "get_device_name": lambda *a, **k: "cpu",
        "get_device_properties": lambda *a, **k: types.SimpleNamespace(
            total_memory=total, name="cpu"
        ),
        "memory_stats": lambda *a, **k: {},
        "reset_peak_memory_stats": lambda *a, **k: None,
        "empty_cache": lambda *a, **k: None,
    }
    for name, call in calls.items():
        setattr(shim, name, call)
    tt_utils.device_type = "cpu"
    tt_utils.device_module = shim
    tt_utils.get_local_device = lambda: torch.device("cpu")


def _patch_flex_attention() -> None:
    """2. torchtitan compiles FlexAttention with max-autotune (Triton, GPU only) and torch
    2.13's ``flex_attention`` refuses CPU inputs that require grad ("FlexAttention does not
    support backward on CPU", a blanket check in ``_validate_device``). Run it eagerly (its
    dense reference path computes forward and backward on CPU) and skip that one check on
    CPU only."""
    import torch.nn.attention.flex_attention as flex
    import torchtitan.models.common.attention as tt_attention

    tt_attention.FlexAttention._compiled_flex_attn = flex.flex_attention
    tt_attention._compiled_create_block_mask = flex.create_block_mask
    original = flex._validate_device

    def validate_device(query: Any, key: Any, value: Any) -> None:
        if query.device.type != "cpu":
            original(query, key, value)

    flex._validate_device = validate_device


def _patch_torch_backports() -> None:
    """3. torchtitan 0.3.0 calls ``schedule.step(arg_mbs=..., kwarg_mbs=...,
    target_mbs=..., losses=..., return_outputs=False)`` with microbatches it split itself;
    torch 2.13.0's ``step`` takes only the whole batch (the new keywords land in ``**kwargs``
    and fail with "Expecting 8 arg_mbs but got 1"): route pre-split microbatches to 2.13's
    ``_step_microbatches``, which takes exactly these lists. And after step 1 it calls
    ``torch.distributed.set_timeout``, which 2.13.0 has only as the private
    ``distributed_c10d._set_pg_timeout``."""
    import torch.distributed as dist
    from torch.distributed.pipelining import schedules

    def backport(cls: Any) -> None:
        original = cls.step

        def step(self: Any, *args: Any, arg_mbs: Any = None, kwarg_mbs: Any = None,
                 target_mbs: Any = None, losses: Any = None, return_outputs: bool = True,
                 loss_kwargs: Any = None, **kwargs: Any) -> Any:  # fmt: skip
            if arg_mbs is None and kwarg_mbs is None and target_mbs is None:
                return original(self, *args, losses=losses, return_outputs=return_outputs,
                                loss_kwargs=loss_kwargs, **kwargs)  # fmt: skip
            if args or kwargs:
                raise TypeError("whole-batch and per-microbatch inputs mixed")
            stages = self._stages if hasattr(self, "_stages") else [self._stage]
            for stage in stages:
                stage.has_backward = self._has_backward
                stage.clear_runtime_states()
            self._step_microbatches(arg_mbs, kwarg_mbs, target_mbs, losses, return_outputs,
                                    loss_kwargs=loss_kwargs)  # fmt: skip
            if return_outputs:
                for stage in stages:
                    if stage.is_last:
                        return self._merge_outputs(stage.output_chunks)
            return None

        cls.step = step

    backport(schedules.PipelineScheduleSingle)
    backport(schedules.PipelineScheduleMulti)
    if not hasattr(dist, "set_timeout"):
        from torch.distributed.distributed_c10d import _set_pg_timeout

        dist.set_timeout = lambda timeout, group=None: _set_pg_timeout(timeout, group)


def _patch_fsdp_sum() -> None:
    """5. FSDP (``dp_shard`` > 1, which expert parallelism borrows its ranks from) fails in
    the first backward on gloo: torchtitan sets every FSDP module's gradient divide factor to
    1 (it scales gradients by the global token count itself), and torch 2.13's FSDP2 then
    reduce-scatters with ``ReduceOp.PREMUL_SUM(1/1)``, which gloo refuses ("Cannot use
    ReduceOp.PREMUL_SUM with Gloo"). Also force FSDP's sum reduction there: a plain SUM and
    a division by that factor of 1, the same numbers."""
    import torchtitan.distributed.fsdp as tt_fsdp
    from torch.distributed.fsdp import FSDPModule

    original = tt_fsdp.disable_fsdp_gradient_division

    def disable_division(model: Any) -> None:
        original(model)
        for module in model.modules():
            if isinstance(module, FSDPModule):
                module.set_force_sum_reduction_for_comms(True)

    tt_fsdp.disable_fsdp_gradient_division = disable_division


def _patch_end_sleep() -> None:
    """4. At the end of training rank 0 sleeps 2 s "for other ranks to complete"; every case
    here then gets a fresh rendezvous store, so the sleep only adds 2 s a case to CI."""
    import torchtitan.trainer as trainer

    class NoSleep(types.ModuleType):
        def __getattr__(self, name: str) -> Any:
            return getattr(time, name)

        @staticmethod
        def sleep(seconds: float) -> None:
            return None

    trainer.time = NoSleep("time")  # type: ignore[assignment]


# ---------------------------------------------------------------- runs


def _free_port() -> int:
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def _agent_store() -> Any:
    """A client of torchrun's own store (``--standalone``: the agent serves it at
    ``MASTER_ADDR:MASTER_PORT``), used only to pass each case's port."""
    from datetime import timedelta

    import torch.distributed as dist

    host = os.environ.get("MASTER_ADDR", "127.0.0.1")
    port = int(os.environ.get("MASTER_PORT", "29500"))
    return dist.TCPStore(host, port, is_master=False, timeout=timedelta(seconds=300))


def run(cases_path: Path, out: Path) -> None:
    """Run every case in these processes; the last stage's rank writes OUT/NAME.json."""
    _patch_device()
    _patch_flex_attention()
    _patch_torch_backports()
    _patch_fsdp_sum()
    _patch_end_sleep()
    from torchtitan.components.metrics import MetricsProcessor
    from torchtitan.train import main

    record: dict[str, Any] = {}
    log = MetricsProcessor.log

    def log_loss(self: Any, step: int, global_avg_loss: float, *args: Any, **kw: Any) -> Any:
        seconds = time.perf_counter() - record["start"]
        loss = float(global_avg_loss)
        entry = {"step": step, "loss": loss, "hex": loss.hex(), "time": seconds}
        record.setdefault("steps", []).append(entry)
        record["start"] = time.perf_counter()
        return log(self, step, global_avg_loss, *args, **kw)

    MetricsProcessor.log = log_loss
    out.mkdir(parents=True, exist_ok=True)
    rank = int(os.environ.get("RANK", "0"))
    agent = _agent_store()
    for index, case in enumerate(json.loads(cases_path.read_text())):
        # A fresh rendezvous store per case: a second process group on torchrun's own store
        # reads the first one's keys and hangs (ranks leave a case up to 2 s apart). Its
        # port is one the system has free when rank 0 asks (a fixed one may be taken by
        # another job's sockets), passed to the other ranks through torchrun's store.
        os.environ["TORCHELASTIC_USE_AGENT_STORE"] = "False"
        key = f"pp_opt_case_port_{index}"
        if rank == 0:
            agent.set(key, str(_free_port()))
        os.environ["MASTER_PORT"] = agent.get(key).decode()
        record.clear()
        started = time.perf_counter()
        record["start"] = started
        sys.argv = ["torchtitan", *case["args"]]
        main()
        steps = record.get("steps", [])
        # The ranks with the loss; the others log -1 (or -2 beside data parallelism). With
        # data parallelism several ranks have it (the same global mean): the last one to
        # finish replaces the file whole.
        if steps and all(s["loss"] >= 0 for s in steps):
            result = {"name": case["name"], "rank": rank, "steps": steps,
                      "wall": time.perf_counter() - started}  # fmt: skip
            part = out / f"{case['name']}.json.{rank}"
            part.write_text(json.dumps(result, indent=1))
            os.replace(part, out / f"{case['name']}.json")


if __name__ == "__main__":
    if sys.argv[1:2] == ["prepare"] and len(sys.argv) == 3:
        prepare(Path(sys.argv[2]))
    elif sys.argv[1:2] == ["run"] and len(sys.argv) == 4:
        run(Path(sys.argv[2]), Path(sys.argv[3]))
    else:
        raise SystemExit(__doc__)
