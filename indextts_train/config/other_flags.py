"""Flags of other trainers, as newcomers type them, and what does the same here: the CLI's refusal of an unknown
flag (cli_flags.py) and the page's *Other flags* box (webui/trainflags.py) ask `flag_instead` before they guess
by spelling, which answered --device with --listen-device and --save-every with --listen-every.
"""

from __future__ import annotations

# Flags of other trainers (the Hugging Face Trainer, nanoGPT, Lightning, fairseq) -> the flags here that do the
# same, the first one the command has. Spelling alone answered --device with --listen-device, --data with
# --accept-data-change and --save-every with --listen-every: flags that do something else.
_OTHER_TRAINERS: dict[str, tuple[str, ...]] = {
    **dict.fromkeys(("--lr", "--peak-lr", "--max-lr", "--base-lr"), ("--learning-rate",)),
    **dict.fromkeys(("--data", "--dataset", "--train", "--train-data", "--train-file", "--train-jsonl", "--train-set",
                     "--data-path", "--manifest"), ("--train-manifest", "--manifest")),
    **dict.fromkeys(("--val", "--valid", "--dev", "--val-data", "--eval-data", "--validation-file", "--eval-manifest",
                     "--valid-manifest", "--validation-manifest"), ("--val-manifest", "--manifest")),
    **dict.fromkeys(("--model", "--pretrained", "--pretrained-model", "--model-path", "--model-name-or-path",
                     "--base-model", "--init-from", "--ckpt", "--gpt", "--gpt-checkpoint", "--checkpoint",
                     "--model-dir", "--checkpoints"), ("--base-checkpoint", "--model-dir", "--checkpoint")),
    **dict.fromkeys(("--resume-from", "--resume-from-checkpoint", "--resume-checkpoint", "--continue"), ("--resume",)),
    **dict.fromkeys(("--save-every", "--save-steps", "--save-freq", "--checkpoint-every", "--ckpt-every"),
                    ("--save-interval",)),
    **dict.fromkeys(("--eval-every", "--eval-steps", "--eval-interval", "--eval-freq", "--val-every", "--valid-every",
                     "--validate-every"), ("--val-interval",)),
    **dict.fromkeys(("--log-every", "--logging-steps", "--log-steps", "--log-freq", "--print-every"),
                    ("--log-interval",)),
    **dict.fromkeys(("--steps", "--max-iters", "--iters", "--num-steps", "--total-steps", "--train-steps",
                     "--max-train-steps", "--num-iterations"), ("--max-steps",)),
    **dict.fromkeys(("--epoch", "--num-epochs", "--num-train-epochs", "--max-epochs", "--n-epochs"), ("--epochs",)),
    **dict.fromkeys(("--bs", "--batch", "--micro-batch", "--micro-batch-size", "--train-batch-size",
                     "--per-device-train-batch-size"), ("--batch-size",)),
    **dict.fromkeys(("--global-batch-size", "--total-batch-size"), ("--effective-batch-size",)),
    **dict.fromkeys(("--gradient-accumulation-steps", "--grad-accum", "--grad-accum-steps", "--accum",
                     "--accumulation-steps", "--accumulate-grad-batches"), ("--grad-accumulation",)),
    **dict.fromkeys(("--warmup", "--warmup-iters", "--num-warmup-steps", "--lr-warmup-steps"), ("--warmup-steps",)),
    **dict.fromkeys(("--fp16", "--bf16", "--half", "--mixed-precision", "--precision", "--autocast"), ("--amp",)),
    **dict.fromkeys(("--gradient-checkpointing", "--activation-checkpointing"), ("--grad-checkpointing",)),
    **dict.fromkeys(("--max-grad-norm", "--clip-grad", "--clip-grad-norm", "--gradient-clip-val", "--clip"),
                    ("--grad-clip",)),
    "--wd": ("--weight-decay",),
    **dict.fromkeys(("--workers", "--dataloader-num-workers", "--num-proc"), ("--num-workers", "--workers")),
    **dict.fromkeys(("--out", "--outdir", "--out-dir", "--output", "--save-dir", "--ckpt-dir", "--checkpoint-dir",
                     "--run-dir", "--exp-dir"), ("--output-dir", "--out", "--output")),
    **dict.fromkeys(("--bpe", "--bpe-model", "--sp-model", "--spm", "--vocab", "--tokenizer-model",
                     "--tokenizer-path"), ("--tokenizer",)),
    **dict.fromkeys(("--cfg", "--config-file", "--config-path", "--yaml"), ("--config",)),
    **dict.fromkeys(("--gpu", "--gpu-name", "--gpu-type"), ("--assume",)),
    **dict.fromkeys(("--save-total-limit", "--keep-last", "--keep"), ("--keep-checkpoints",)),
    **dict.fromkeys(("--patience", "--early-stopping"), ("--early-stop-patience",)),
    **dict.fromkeys(("--lora", "--use-lora", "--peft"), ("--train-scope lora",)),
}

# Other trainers' flags that train has no counterpart for: what does it here.
_MULTI_GPU = ("several GPUs are started by torchrun, not by a flag: torchrun --nproc-per-node N -m indextts_train "
              "--train-manifest ... (docs/hardware.md); one GPU needs none")
_DEVICE = ("the run takes the GPU when there is one, else the CPU; CUDA_VISIBLE_DEVICES=1 picks another GPU "
           "(docs/hardware.md)")
_TRAIN_HINTS = {
    **dict.fromkeys(("--gpus", "--num-gpus", "--ngpus", "--n-gpu", "--nproc-per-node", "--world-size", "--devices",
                     "--multi-gpu", "--distributed", "--ddp"), _MULTI_GPU),
    **dict.fromkeys(("--device", "--gpu", "--gpu-id", "--gpu-ids", "--cuda", "--cpu", "--no-cuda"), _DEVICE),
    **dict.fromkeys(("--wandb", "--report-to", "--tensorboard", "--logger"),
                    "TensorBoard logs are always written: tensorboard --logdir OUTPUT_DIR/logs"),
}


def flag_instead(typed: str, flags: list[str]) -> str | None:
    """What to type for another trainer's flag on a command with `flags`, or None."""
    key = "--" + typed.lstrip("-").lower().replace("_", "-")
    meant = next((flag for flag in _OTHER_TRAINERS.get(key, ()) if flag.split()[0] in flags), None)
    if meant is not None:
        return f"did you mean {meant}?"
    return _TRAIN_HINTS.get(key) if "--train-manifest" in flags else None
