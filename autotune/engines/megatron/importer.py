"""A user's Megatron-LM ``pretrain_gpt.py`` argument list as autotune's model, plan and workload
(``autotune simulate --from-megatron ARGS_FILE``); the inverse of :mod:`autotune.engines.megatron.export`.

The file: ``pretrain_gpt.py`` arguments, one per line or on shell-style lines (``\\`` continuations,
``#`` comments, quotes), or a launch script (autotune's own launch_torchrun.sh, or its ``--dry-run``
output): the line with the ``*.py`` word is the command, words before it (``torchrun ... pretrain_gpt.py``)
are the launcher's and are listed as ignored (they may hold shell syntax). Bash arrays defined once in the
script (``GPT_MODEL_ARGS=( ... )``, Megatron-LM's examples' layout) and variables assigned once to a literal
are expanded (:mod:`autotune.engines.shell_vars`); any other shell variable in the Megatron arguments is
refused: autotune runs no shell. ``PYTORCH_CUDA_ALLOC_CONF`` set on
that line or exported before it gives ``memory_reclaim expandable_segments`` (export writes it back).

Every option is checked against the recorded facts of Megatron-LM's parser (``autotune/engines/megatron/
arg_facts.jsonl``: option strings, actions, value types, nargs and choices of
``megatron/training/arguments.py`` ``add_megatron_arguments`` at commit d98e8a64ddf3, written by
tests/data/extract_megatron_args.py): an unknown option, a value of the wrong type or outside the choices is
one error naming the option and what is valid, as ``pretrain_gpt.py`` would fail.

Defaults and rules used (arguments.py ``validate_args`` and megatron/core/transformer/transformer_config.py
at that commit): ``--position-embedding-type`` learned_absolute (``--use-rotary-position-embeddings`` sets
rope); ``--normalization`` LayerNorm; linear biases on unless ``--disable-bias-linear``; dropout 0.1;
``--rotary-base`` 10000; ``--rope-scaling-factor`` 8; ``--ffn-hidden-size`` 4h, or int(8h/3 / 64) x 64 with
``--swiglu``; ``--kv-channels`` h / heads; ``--num-query-groups`` only with ``--group-query-attention``
(argument_utils.py); ``--global-batch-size`` micro-batch x DP; sequence parallelism off at TP 1;
``--recompute-granularity full`` needs ``--recompute-method`` and ``--recompute-num-layers``; FP8 only with
``--fp8-format`` (``--fp8-recipe`` default delayed, amax history 1, ``most_recent``);
``--data-parallel-sharding-strategy`` default optim_grads_params; the DDP bucket (training.py
``resolve_ddp_bucket_size``; distributed_data_parallel.py bucket_size None): one bucket without
``--overlap-grad-reduce`` (the plan keeps its default bucket, which the megatron profile then does not use), else ``--ddp-bucket-size``
parameters or max(4e7, 1e6 x DP x CP), counted in the FP32 main gradients it reduces (4 bytes, 2 with
``--grad-reduce-in-bf16``; :func:`autotune.engines.megatron.export.ddp_bucket_size` is the inverse);
``--pipeline-model-parallel-layout`` (``E`` embedding, ``t`` layer, ``L`` loss, ``|`` between virtual
stages, ``(..)*n`` and ``x*n`` repeat: pipeline_parallel_layer_layout.py ``parse_str_to_list``);
``--account-for-embedding/loss-in-pipeline-split`` count the embedding / loss as one layer of the split.
Mixture-of-experts, multi-latent-attention, MTP, sliding-window, sink and GPT-OSS options and the expert
layout: :mod:`autotune.engines.megatron.moe_import`.
"""

from __future__ import annotations

import functools
import json
import math
import re
from pathlib import Path
from typing import Any

from autotune.errors import ConfigError, PlanError
from autotune.engines.imported import ImportedLaunch, allocator_reclaim, catalog_name, label_from_path
from autotune.engines.megatron.moe_import import (read_attention_and_gpt_oss, read_moe_model, read_moe_plan,
                                                  read_recompute_modules, read_rope_scaling)
from autotune.engines.shell_vars import launcher_world, read_launch
from autotune.export.script_run import looks_like_script, recorded_launch

FACTS_FILE = Path(__file__).resolve().parent / "arg_facts.jsonl"
MEGATRON_COMMIT = "d98e8a64ddf3"
_SWITCH_ACTIONS = ("store_true", "store_false", "store_const", "count", "BooleanOptionalAction", "_HelpAction")

#: options that make the launch a model or a parallelism autotune does not simulate: option -> (what it is,
#: predicate on the parsed value tuple that says the option is in effect)
REFUSED = {
    "--rotary-interleaved": ("interleaved RoPE", None),
    "--squared-relu": ("a squared-ReLU MLP", None),
    "--apply-residual-connection-post-layernorm": ("post-norm residuals", None),
    "--rotary-percent": ("partial RoPE", lambda v: v[0] != 1.0),
    "--rotary-seq-len-interpolation-factor": ("RoPE position interpolation", None),
    "--no-rope-freq": ("layers without RoPE", None),
    "--hybrid-layer-pattern": ("a hybrid (Mamba) layer pattern", None),
    "--heterogeneous-layers-config-path": ("heterogeneous layers", None),
    "--heterogeneous-layers-config-encoded-json": ("heterogeneous layers", None),
    "--fp16": ("FP16 training (autotune models BF16 with FP32 main weights: --bf16)", None),
    "--use-torch-fsdp2": (("torch FSDP2 inside Megatron-LM (the megatron profile models DDP, the distributed "
                           "optimizer and Megatron-FSDP)"), None),
}

#: option-name prefixes of a training that is not pretraining steps: prefix -> what it is (checked before the
#: arguments are parsed, so the reason is named even when another of its options is incomplete)
REFUSED_PREFIXES = {
    "--grpo-": "reinforcement-learning (GRPO) training: rollouts generated by inference between training steps",
    "--rl-": "reinforcement-learning training (train_rl.py): rollouts generated by inference between training steps",
    "--langrl-": "reinforcement-learning environments (train_rl.py)",
}
NO_COST_FILE = Path(__file__).resolve().parent / "no_cost_args.yaml"
NO_COST = "no cost effect: changes no step time or memory (engine facts: autotune/engines/megatron/no_cost_args.yaml)"
#: what --run-script does, appended to the static reader's errors on a shell script
RUN_SCRIPT_HINT = ("; or let autotune run the script under bash with torchrun/python replaced by a recorder: add "
                   "--run-script (positional arguments: --script-args '...'; environment: --script-env NAME=VALUE)")

#: run settings that change no step's time or memory (optimizer hyper-parameters, data, logging,
#: checkpoint paths, the tokenizer): option-name prefixes
RUN_PREFIXES = ("--lr", "--min-lr", "--weight-decay", "--start-weight-decay", "--end-weight-decay", "--adam-",
                "--sgd-", "--clip-grad", "--init-method", "--seed", "--train-iters", "--train-samples", "--eval-",
                "--log", "--save", "--load", "--no-load", "--no-save", "--data-", "--split", "--tokenizer-",
                "--vocab-file", "--merge-file", "--mock-data", "--tensorboard", "--wandb", "--exit-", "--ckpt-",
                "--async-save", "--dist-ckpt", "--use-checkpoint", "--finetune", "--dataloader-type",
                "--num-workers", "--distributed-timeout", "--timing-log", "--profile", "--use-mcore-models",
                "--no-create-attention-mask", "--reset-", "--eod-mask-loss", "--test-", "--valid-",
                "--per-split-data-args", "--null-tokenizer", "--hf-", "--output-bert", "--num-dataset-builder")
RUN = "run settings: no effect on a step's time or memory"
NOT_MODELLED = "not modelled: may change step time or memory"


def _q(v: object) -> str:
    """``repr(v)`` as an error line may quote it: at most 100 printable characters (files.excerpt)."""
    from autotune.files import excerpt
    return excerpt(repr(v))


def _e(v: object) -> str:
    """``v`` (a word read from the user's file) as an error line may quote it (files.excerpt)."""
    from autotune.files import excerpt
    return excerpt(v)


@functools.lru_cache(maxsize=1)
def no_cost_options() -> dict[str, dict]:
    """Option -> its :data:`NO_COST_FILE` entry (``what``, ``source``): the options that change no step time
    or memory."""
    from autotune.files import load_shipped_yaml
    data = load_shipped_yaml(NO_COST_FILE.read_text())
    return {e["option"]: e for e in data["options"]}


@functools.lru_cache(maxsize=1)
def parser_facts() -> dict[str, dict]:
    """Option string -> its recorded facts (action, type, nargs, choices, dest)."""
    lines = FACTS_FILE.read_text().splitlines()
    return {f["option"]: f for f in map(json.loads, lines[1:])}


def read_args_file(path: str | Path) -> tuple[list[str], list[str]]:
    """(argument tokens, launcher words before ``*.py``) of an argument file (:func:`read_launch`)."""
    words, launcher, _ = read_launch(path)
    return words, launcher


def _is_option(tok: str) -> bool:
    return tok.startswith("--") or (tok.startswith("-") and not re.fullmatch(r"-[0-9.]+([eE][-+]?[0-9]+)?", tok))


def _convert(opt: str, f: dict, raw: str, source: str) -> Any:
    from autotune.spec.validate import ASCII_FLOAT_PATTERN, ASCII_INT_PATTERN

    t = f["type"]
    try:
        # ASCII digits only (issue 37): int()/float() also read "٨" as 8 and "1_0" as 10
        if t in ("int", "float") and not re.fullmatch(ASCII_INT_PATTERN if t == "int" else ASCII_FLOAT_PATTERN,
                                                      raw.strip()):
            raise ValueError(raw)
        v: Any = int(raw) if t == "int" else float(raw) if t == "float" else raw
    except ValueError:
        kind = {"int": "an integer", "float": "a number"}[t]
        raise ConfigError(f"{source}: {_e(opt)} {_q(raw)}: Megatron-LM parses it as {t} (type={t}); give {kind}") from None
    if f["choices"] is not None and str(v) not in f["choices"]:
        raise ConfigError(f"{source}: {_e(opt)} {_q(raw)}: valid values are {', '.join(f['choices'])}")
    return v


def parse_megatron_args(tokens: list[str], source: str) -> dict[str, tuple]:
    """Option -> its value tuple (``()`` for a switch; the last occurrence wins, as argparse), checked against
    :func:`parser_facts` (``--opt=value`` accepted).

    Raises:
        ConfigError: an unknown option (with the nearest known one), a switch given a value, a missing or
            extra value, a value of the wrong type or outside the choices.
    """
    import difflib

    facts = parser_facts()
    out: dict[str, tuple] = {}
    i = 0
    while i < len(tokens):
        tok = tokens[i]
        if not _is_option(tok):
            prev = next((t for t in reversed(tokens[:i]) if _is_option(t)), None)
            if prev is not None and prev.partition("=")[0] in facts and i >= 2 and not _is_option(tokens[i - 1]):
                raise ConfigError(f"{source}: {_q(tok)} is not an option and follows {_e(prev)} {_e(tokens[i - 1])}, "
                                  "which takes one value; pretrain_gpt.py would stop too (argparse: unrecognized "
                                  "arguments; an unquoted ${ARRAY[@]} splits a quoted element into words)")
            raise ConfigError(f"{source}: {_q(tok)} is not an option and follows none that takes a value")
        opt, eq, inline = tok.partition("=")
        f = facts.get(opt)
        if f is None:
            near = difflib.get_close_matches(opt, list(facts), n=1) if len(opt) <= 100 else []
            raise ConfigError(f"{source}: {_e(opt)} is not an argument of Megatron-LM's pretrain_gpt.py (its parser at "
                              f"commit {MEGATRON_COMMIT})" + (f"; did you mean {near[0]}?" if near else ""))
        i += 1
        nargs = f["nargs"]
        if f["action"] in _SWITCH_ACTIONS or nargs == 0:
            if eq:
                raise ConfigError(f"{source}: {_e(opt)} is a switch and takes no value, got {_q(inline)}")
            out[opt] = ()
            continue
        if eq:
            raw = [inline]
        else:
            raw = []
            while i < len(tokens) and not _is_option(tokens[i]) and (nargs in ("+", "*") or len(raw) < (nargs or 1)):
                raw.append(tokens[i])
                i += 1
        want = {None: "one value", "?": "at most one value", "+": "one or more values", "*": "values"}.get(
            nargs, f"{nargs} values")
        if (nargs is None and len(raw) != 1) or (nargs == "+" and not raw) or (isinstance(nargs, int) and len(raw) != nargs):
            raise ConfigError(f"{source}: {_e(opt)} takes {want}, got {len(raw)}")
        vals = tuple(_convert(opt, f, r, source) for r in raw)
        out[opt] = out.get(opt, ()) + vals if f["action"] == "append" else vals
    return out


class _Reader:
    """The parsed options with bookkeeping: which are modelled (export writes them back the same), which
    handled otherwise, and the approximations."""

    def __init__(self, args: dict[str, tuple], source: str):
        self.args, self.source = args, source
        self.modelled: dict[str, tuple] = {}
        self.handled: set[str] = set()
        self.ignored: list[tuple[str, str]] = []
        self.approx: list[str] = []
        self.env: dict[str, str] = {}

    def has(self, opt: str) -> bool:
        return opt in self.args

    def value(self, opt: str, default: Any = None, *, modelled: bool = True) -> Any:
        """The option's (single) value, or ``default``; recorded as modelled (or just handled)."""
        if opt not in self.args:
            return default
        if modelled:
            self.modelled[opt] = self.args[opt]
        else:
            self.handled.add(opt)
        v = self.args[opt]
        return v[0] if len(v) == 1 else v

    def switch(self, opt: str, *, modelled: bool = True) -> bool:
        if opt in self.args:
            if modelled:
                self.modelled[opt] = ()
            else:
                self.handled.add(opt)
            return True
        return False

    def demote(self, opt: str) -> None:
        """``opt`` is modelled but export writes its meaning with other flags: handled, not compared."""
        if opt in self.modelled:
            del self.modelled[opt]
            self.handled.add(opt)

    def ignore(self, opt: str, why: str) -> None:
        if opt in self.args:
            self.ignored.append((_show(opt, self.args[opt]), why))
            self.handled.add(opt)

    def positive(self, opt: str, default: int | None, what: str = "") -> int:
        v = self.value(opt, default)
        if v is None:
            raise ConfigError(f"{self.source}: {opt} is missing; pretrain_gpt.py needs it{what}")
        if v < 1:
            raise ConfigError(f"{self.source}: {opt} {v}: must be an integer >= 1")
        return v

    def refuse(self, opt: str, what: str) -> None:
        raise ConfigError(f"{self.source}: {_show(opt, self.args.get(opt, ()))}: {what}; autotune cannot simulate "
                          "this model or plan, so it does not predict it")


def _show(opt: str, vals: tuple) -> str:
    return " ".join([opt, *(f"{v:g}" if isinstance(v, float) else str(v) for v in vals)])


#: longest unrolled --pipeline-model-parallel-layout, characters (4 x MAX_NUM_LAYERS: every layer, the
#: embedding, the loss and a "|" per stage fit many times over)
MAX_LAYOUT_CHARS = 4 * 2048


def _layout_stages(layout: str, source: str, mtp: int = 0) -> list[str]:
    """Stages of a ``--pipeline-model-parallel-layout`` string, repetitions unrolled (Megatron's grammar)."""
    s = layout.replace(",", "")

    def repeat(m: re.Match) -> str:
        # bounded before it is built: "t*999999999" took 24 s and 2 GB to unroll (issue 37 sweep); a valid
        # layout has at most num_layers (<= MAX_NUM_LAYERS) t's plus an E, an L and "|" per virtual stage
        n = int(m.group(2))
        if len(m.group(1)) * n + len(s) > MAX_LAYOUT_CHARS:
            raise ConfigError(f"{source}: --pipeline-model-parallel-layout {_q(layout)}: unrolls to more than "
                              f"{MAX_LAYOUT_CHARS:,} characters ({_q(m.group(0))}); a layout lists each layer once")
        return m.group(1) * n

    for pat in (r"\(([^)]+)\)\*([0-9]{1,12})", r"(.)\*([0-9]{1,12})"):     # ASCII digits: "\d" takes "٨"
        s = re.sub(pat, repeat, s)
    stages = s.split("|")
    if mtp and "m" * mtp not in stages[-1]:
        raise ConfigError(f"{source}: --pipeline-model-parallel-layout {_q(layout)}: place the {mtp} multi-token "
                          "prediction layers (m) in the last virtual stage before the loss (L)")
    for i, st in enumerate(stages):
        bad = set(st) - set("EtLm")
        if bad:
            raise ConfigError(f"{source}: --pipeline-model-parallel-layout {_q(layout)}: unknown layer character(s) "
                              f"{_q(''.join(sorted(bad)))}; known: E (embedding), t (layer), L (loss), m (MTP)")
        if "m" in st and (i != len(stages) - 1 or st.count("m") != mtp or not st.endswith("m" * mtp + "L")):
            raise ConfigError(f"{source}: --pipeline-model-parallel-layout {_q(layout)}: the {mtp} multi-token "
                              "prediction layers (m, --mtp-num-layers) go in the last virtual stage, before the loss "
                              "(L), as autotune's plans place them")
        if ("E" in st and i != 0) or ("L" in st and i != len(stages) - 1):
            raise ConfigError(f"{source}: --pipeline-model-parallel-layout {_q(layout)}: the embedding (E) must be in "
                              "the first virtual stage and the loss (L) in the last, as autotune's plans place them")
    return stages


def _model(r: _Reader, label: str):
    from autotune.engines.megatron.export import MEGATRON_LLAMA3_SCALING
    from autotune.spec.models import ModelSpec, RopeScaling

    src = r.source
    L = r.positive("--num-layers", None)
    h = r.positive("--hidden-size", None)
    nq = r.positive("--num-attention-heads", None)
    pe = r.value("--position-embedding-type", "learned_absolute")
    if r.switch("--use-rotary-position-embeddings", modelled=False):
        pe = "rope"      # validate_args: the deprecated switch sets position_embedding_type = rope
    mla = r.has("--multi-latent-attention")
    if pe != "rope" and not (pe == "yarn" and not mla):
        raise ConfigError(f"{src}: position embedding {pe}" + (" (Megatron-LM's default; Llama-style models pass "
                          "--position-embedding-type rope)" if not r.has("--position-embedding-type") else "")
                          + ": autotune simulates RoPE (and YaRN) models only")
    norm = r.value("--normalization", "LayerNorm")
    if norm != "RMSNorm":
        raise ConfigError(f"{src}: --normalization {norm}" + (" (Megatron-LM's default)" if not r.has("--normalization")
                          else "") + ": autotune simulates RMSNorm models only (add --normalization RMSNorm)")
    extra = read_attention_and_gpt_oss(r)       # windows, sinks, GPT-OSS's MLP and biases (moe_import.py)
    if not r.switch("--disable-bias-linear") and not extra.get("features"):
        raise ConfigError(f"{src}: biases on every linear layer (Megatron-LM's default without --disable-bias-linear): "
                          "autotune simulates models without linear biases (Q/K/V biases: --add-qkv-bias)")
    swiglu, openai = r.switch("--swiglu"), r.switch("--openai-gelu")
    if swiglu and openai:
        raise ConfigError(f"{src}: --swiglu and --openai-gelu both given; Megatron-LM uses SwiGLU, drop --openai-gelu")
    ffn_default = int((4 * h * 2 / 3) / 64) * 64 if swiglu else 4 * h
    ffn = r.positive("--ffn-hidden-size", ffn_default)
    if not r.has("--kv-channels") and h % nq:
        raise ConfigError(f"{src}: --hidden-size {h} is not a multiple of --num-attention-heads {nq}; give "
                          "--kv-channels (the head width)")
    d = r.positive("--kv-channels", h // nq)
    nkv = nq
    if r.has("--group-query-attention"):
        nkv = r.positive("--num-query-groups", 1)
        if nkv == nq:
            r.ignore("--group-query-attention", "K/V heads = query heads: the same as no grouping")
            r.ignore("--num-query-groups", "K/V heads = query heads: the same as no grouping")
        else:
            r.switch("--group-query-attention")
    else:
        r.ignore("--num-query-groups", "no effect without --group-query-attention (argument_utils.py)")
    scaling = read_rope_scaling(r, mla=mla, pe=pe) if mla or pe == "yarn" else None
    if scaling is None and r.switch("--use-rope-scaling"):
        scaling = RopeScaling(type="llama3", factor=r.value("--rope-scaling-factor", 8.0), **MEGATRON_LLAMA3_SCALING)
    else:
        r.ignore("--rope-scaling-factor", "no effect without --use-rope-scaling")
    if r.args.get("--rotary-percent", (None,))[0] == 1.0:
        r.ignore("--rotary-percent", "1.0: Megatron-LM's default (RoPE on the whole head)")
    theta = r.value("--rotary-base", 10000)
    if theta <= 0:
        raise ConfigError(f"{src}: --rotary-base {theta}: must be a positive integer")
    for opt in ("--hidden-dropout", "--attention-dropout"):
        p = r.args.get(opt, (0.1,))[0]
        if p == 0:
            r.value(opt)
        else:
            r.handled.add(opt)
            r.approx.append(f"{_show(opt, (p,))}{'' if r.has(opt) else ' (Megatron-LM default)'}: costed without "
                            "dropout (the cost model has no dropout kernels); export writes 0")
    vocab = r.value("--vocab-size")
    if vocab is None:
        vocab = _tokenizer_vocab(r)
    if vocab < 1:
        raise ConfigError(f"{src}: --vocab-size {vocab}: must be an integer >= 1")
    r.ignore("--make-vocab-size-divisible-by", "not modelled: Megatron-LM pads the vocabulary to a multiple of this x "
                                               "TP; the cost model counts --vocab-size rows")
    maxpos = r.positive("--max-position-embeddings", None)
    act = (True, "silu") if swiglu or extra.get("features") else (False, "gelu_pytorch_tanh") if openai else (False, "gelu")
    try:
        m = ModelSpec(name=label, hidden_size=h, num_layers=L, num_heads=nq, num_kv_heads=nkv, ffn_hidden_size=ffn,
                      vocab_size=vocab, tied_embeddings=not r.switch("--untie-embeddings-and-output-weights"),
                      gated_mlp=act[0], mlp_activation=act[1], rope_theta=float(theta),
                      norm_eps=r.value("--norm-epsilon", 1e-5), max_seq_len=maxpos,
                      rope_scaling=scaling, **{"head_dim": d, "qkv_bias": r.switch("--add-qkv-bias"), **extra,
                                               **read_moe_model(r, ffn=ffn, L=L, biases=bool(extra.get("features")))})
    except ConfigError as e:
        raise ConfigError(f"{src}: {e}") from None
    return catalog_name(m)


def _tokenizer_vocab(r: _Reader) -> int:
    """The vocabulary of a local Hugging Face tokenizer folder (its ``config.json`` ``vocab_size``)."""
    tok = r.args.get("--tokenizer-model", (None,))[0]
    cfg = Path(tok) / "config.json" if tok else None
    if cfg is not None and cfg.is_file():
        from autotune.files import read_json_file
        d = read_json_file(cfg, what="tokenizer config")     # the one reader: size cap, regular file, no /proc
        v = d.get("vocab_size") if isinstance(d, dict) else None
        if isinstance(v, int) and not isinstance(v, bool) and v > 0:
            r.approx.append(f"vocabulary {v} tokens from {cfg} (vocab_size)")
            return v
    kind = r.args.get("--tokenizer-type", ("no tokenizer",))[0]
    raise ConfigError(f"{r.source}: no --vocab-size and no local tokenizer folder with a config.json ({kind}"
                      + (f" {tok}" if tok else "") + "); add --vocab-size N (Llama 3: 128256)")


def _plan_and_workload(r: _Reader, model, num_gpus: int):
    from autotune.spec.moe_plan import validate_moe
    from autotune.spec.plan import Plan, Workload

    src, L = r.source, model.num_layers
    tp = r.positive("--tensor-model-parallel-size", 1)
    pp = r.positive("--pipeline-model-parallel-size", 1)
    cp = r.positive("--context-parallel-size", 1)
    if not model.is_moe:
        for o in ("--expert-model-parallel-size", "--expert-tensor-parallel-size", "--overlap-moe-expert-parallel-comm"):
            r.ignore(o, "no effect without --num-experts (a dense model)")
    if num_gpus % (tp * pp * cp):
        raise ConfigError(f"{src}: TP {tp} x PP {pp} x CP {cp} = {tp * pp * cp} does not divide --gpus {num_gpus} "
                          "(world size = TP x PP x CP x DP)")
    dp = num_gpus // (tp * pp * cp)
    mbs = r.positive("--micro-batch-size", None)
    gbs = r.positive("--global-batch-size", mbs * dp)
    if gbs % (mbs * dp):
        raise ConfigError(f"{src}: --global-batch-size {gbs} is not a multiple of --micro-batch-size {mbs} x DP {dp} "
                          f"(DP = {num_gpus} GPUs / (TP {tp} x PP {pp} x CP {cp}))")
    seq = r.positive("--seq-length", None)
    if cp > 1 and seq % (2 * cp):
        raise ConfigError(f"{src}: --seq-length {seq} must be a multiple of 2 x --context-parallel-size {cp} "
                          "(validate_args)")
    if seq > model.max_seq_len:
        r.approx.append(f"--max-position-embeddings {model.max_seq_len} < --seq-length {seq}: export writes {seq}")
        r.demote("--max-position-embeddings")
    # ---- pipeline split ----
    given = [o for o in ("--num-layers-per-virtual-pipeline-stage", "--num-virtual-stages-per-pipeline-rank",
                         "--pipeline-model-parallel-layout") if r.has(o)]
    if len(given) > 1:
        raise ConfigError(f"{src}: {' and '.join(given)}: give at most one of them (validate_args)")
    uneven = [o for o in ("--decoder-first-pipeline-num-layers", "--decoder-last-pipeline-num-layers") if r.has(o)]
    if uneven and given:
        raise ConfigError(f"{src}: {uneven[0]} with {given[0]}: an uneven interleaved split is not modelled this way; "
                          "give it as --pipeline-model-parallel-layout")
    emb = int(r.switch("--account-for-embedding-in-pipeline-split", modelled=False))
    loss = int(r.switch("--account-for-loss-in-pipeline-split", modelled=False))
    vpp, stage_layers = 1, None
    # validate_args: an interleaved schedule (--num-layers-per-virtual-pipeline-stage or
    # --num-virtual-stages-per-pipeline-rank) asserts pipeline-model-parallel size > 1 (> 2 without P2P overlap)
    inter = [o for o in given if o != "--pipeline-model-parallel-layout"]
    need = 2 if r.has("--no-overlap-p2p-communication") else 1
    if inter and pp <= need:
        raise ConfigError(f"{src}: {_show(inter[0], r.args[inter[0]])} with --pipeline-model-parallel-size {pp}: "
                          f"Megatron-LM refuses an interleaved schedule unless the pipeline size is > {need}"
                          + (" with --no-overlap-p2p-communication" if need == 2 else "")
                          + " (validate_args); drop it or raise the pipeline size")
    if pp == 1:
        for o in given + ["--decoder-first-pipeline-num-layers", "--decoder-last-pipeline-num-layers"]:
            r.ignore(o, "no effect without pipeline parallelism")
        given = []
    if "--pipeline-model-parallel-layout" in given:
        stages = _layout_stages(r.value("--pipeline-model-parallel-layout", modelled=False), src,
                                model.mtp_num_layers)
        if len(stages) % pp:
            raise ConfigError(f"{src}: --pipeline-model-parallel-layout has {len(stages)} stages, not a multiple of "
                              f"--pipeline-model-parallel-size {pp}")
        vpp, stage_layers = len(stages) // pp, tuple(st.count("t") for st in stages)
        if sum(stage_layers) != L:
            raise ConfigError(f"{src}: --pipeline-model-parallel-layout places {sum(stage_layers)} layers (t); the "
                              f"model has --num-layers {L}")
        if len(set(stage_layers)) > 1 or model.mtp_num_layers:
            r.modelled["--pipeline-model-parallel-layout"] = r.args["--pipeline-model-parallel-layout"]
    elif given:
        units = L + emb + loss
        if "--num-virtual-stages-per-pipeline-rank" in given:
            vpp = r.positive("--num-virtual-stages-per-pipeline-rank", None)
        else:
            per = r.positive("--num-layers-per-virtual-pipeline-stage", None)
            if units % pp or (units // pp) % per:
                raise ConfigError(f"{src}: {units} layers over --pipeline-model-parallel-size {pp} do not form stages "
                                  f"of --num-layers-per-virtual-pipeline-stage {per} (validate_args)")
            vpp = units // pp // per
        if units % (pp * vpp):
            raise ConfigError(f"{src}: {units} layers do not split evenly over PP {pp} x VPP {vpp} virtual stages")
        if emb or loss:
            sl = [units // (pp * vpp)] * (pp * vpp)
            sl[0] -= emb
            sl[-1] -= loss
            stage_layers = tuple(sl)
    elif r.has("--decoder-first-pipeline-num-layers") or r.has("--decoder-last-pipeline-num-layers"):
        first = r.value("--decoder-first-pipeline-num-layers", modelled=False)
        last = r.value("--decoder-last-pipeline-num-layers", modelled=False)
        middle = pp - (first is not None) - (last is not None)
        rest = L - (first or 0) - (last or 0)
        if middle < 0 or rest < 0 or (middle and rest % middle) or (not middle and rest):
            raise ConfigError(f"{src}: --decoder-first/last-pipeline-num-layers {first}/{last}: the other {L} - "
                              f"{(first or 0) + (last or 0)} layers do not split evenly over {max(middle, 0)} stages")
        sl = [rest // middle if middle else 0] * pp
        if first is not None:
            sl[0] = first
        if last is not None:
            sl[-1] = last
        stage_layers = tuple(sl)
    elif pp > 1 and (emb or loss):
        units = L + emb + loss
        if units % pp:
            raise ConfigError(f"{src}: {units} layers (with the embedding / loss counted) do not split over PP {pp}")
        sl = [units // pp] * pp
        sl[0] -= emb
        sl[-1] -= loss
        stage_layers = tuple(sl)
    if pp == 1:
        for o in ("--account-for-embedding-in-pipeline-split", "--account-for-loss-in-pipeline-split"):
            r.ignore(o, "no effect without pipeline parallelism")
    # export writes --num-layers-per-virtual-pipeline-stage for an even interleaved split only (else a layout)
    if not (vpp > 1 and stage_layers is None):
        r.demote("--num-layers-per-virtual-pipeline-stage")
    r.demote("--num-virtual-stages-per-pipeline-rank")
    schedule = "interleaved_1f1b" if pp > 1 and vpp > 1 else "1f1b"
    # ---- sequence parallelism, recompute ----
    sp = False
    if tp > 1:
        sp = r.switch("--sequence-parallel")
    else:
        r.ignore("--sequence-parallel", "validate_args turns it off at TP 1")
    recompute, rnl, rmods = "none", 0, None
    gran = r.value("--recompute-granularity")
    if r.switch("--recompute-activations", modelled=False):
        gran = gran or "selective"        # validate_args: --recompute-activations = selective
    if gran == "selective":
        recompute = "selective"
        rmods = read_recompute_modules(r)
        for o in ("--recompute-method", "--recompute-num-layers"):
            if r.has(o):
                raise ConfigError(f"{src}: {o} with --recompute-granularity selective: Megatron-LM refuses it "
                                  "(validate_args: no recompute method for selective recomputing)")
    elif gran == "full":
        method, n = r.value("--recompute-method"), r.value("--recompute-num-layers")
        if method is None or n is None:
            raise ConfigError(f"{src}: --recompute-granularity full needs --recompute-method uniform|block and "
                              "--recompute-num-layers N (transformer_config.py)")
        if n < 0:
            raise ConfigError(f"{src}: --recompute-num-layers {n}: must be >= 0")
        if method == "block" and n == 0:
            r.approx.append("--recompute-method block --recompute-num-layers 0: no layer recomputes; costed as none")
        else:
            recompute = "full"
            if method == "block":
                rnl = n
            elif n > 1:
                r.approx.append(f"--recompute-method uniform --recompute-num-layers {n}: every layer recomputes, "
                                f"saving one input per {n} layers; costed as uniform 1 (one per layer)")
                r.demote("--recompute-num-layers")
    else:
        for o in ("--recompute-method", "--recompute-num-layers", "--recompute-modules"):
            r.ignore(o, "no effect without --recompute-granularity")
    if type(offload := r.value("--cpu-offloading-num-layers", 0)) is not int or offload < 0:  # N > 0 sets cpu_offloading
        raise ConfigError(f"{src}: --cpu-offloading-num-layers {offload}: must be an integer >= 0 (0: no offloading)")
    # ---- ZeRO ----
    zero = 0
    if r.switch("--use-megatron-fsdp"):
        strategy = r.value("--data-parallel-sharding-strategy", "optim_grads_params")
        zero = {"no_shard": 0, "optim": 1, "optim_grads": 2, "optim_grads_params": 3}[strategy]
        if zero < 2:
            r.demote("--use-megatron-fsdp")
            r.demote("--data-parallel-sharding-strategy")
            r.approx.append(f"Megatron-FSDP {strategy}: costed as ZeRO-{zero} "
                            f"({'DDP' if zero == 0 else 'the distributed optimizer'}), which export writes")
        if r.args.get("--ckpt-format", (None,))[0] == "fsdp_dtensor" and zero >= 2:
            r.value("--ckpt-format")
        if r.switch("--use-distributed-optimizer", modelled=False):
            r.approx.append("--use-distributed-optimizer with --use-megatron-fsdp: Megatron-FSDP shards")
    elif r.switch("--use-distributed-optimizer"):
        zero = 1
        r.ignore("--data-parallel-sharding-strategy", "no effect without --use-megatron-fsdp")
    else:
        r.ignore("--data-parallel-sharding-strategy", "no effect without --use-megatron-fsdp")
    # ---- overlap ----
    ogr = r.switch("--overlap-grad-reduce")
    opg = r.switch("--overlap-param-gather")
    tpo = False
    if tp > 1:
        tpo = r.switch("--tp-comm-overlap")
    else:
        r.ignore("--tp-comm-overlap", "no effect at TP 1")
    # validate_args: "--overlap-param-gather only supported with distributed optimizer, megatron fsdp ..."
    # and "Tensor parallel communication/GEMM overlap can happen only when sequence parallelism is enabled"
    if opg and zero == 0:
        raise ConfigError(f"{src}: --overlap-param-gather needs --use-distributed-optimizer or --use-megatron-fsdp "
                          "(validate_args)")
    if opg and not ogr:
        raise ConfigError(f"{src}: --overlap-param-gather needs --overlap-grad-reduce (validate_args)")
    if tpo and not sp:
        raise ConfigError(f"{src}: --tp-comm-overlap needs --sequence-parallel (validate_args)")
    async_coll = True
    if r.has("--no-overlap-p2p-communication"):
        if pp == 1:
            r.ignore("--no-overlap-p2p-communication", "no effect without pipeline parallelism")
        elif ogr or opg or tpo:
            r.switch("--no-overlap-p2p-communication", modelled=False)
            r.approx.append("--no-overlap-p2p-communication with DP/TP overlap on: autotune has one switch for "
                            "asynchronous collectives; costed with the P2P transfers overlapped")
        else:
            r.switch("--no-overlap-p2p-communication")
            async_coll = False
    # ---- precision ----
    if not r.switch("--bf16"):
        raise ConfigError(f"{src}: no --bf16: FP32 training; autotune simulates BF16 training with FP32 main "
                          "weights (add --bf16)")
    precision = "bf16"
    if r.has("--fp8-format"):
        fmt = r.value("--fp8-format")
        recipe = r.value("--fp8-recipe", "delayed")
        if recipe in ("blockwise", "custom"):
            r.refuse("--fp8-recipe", f"FP8 recipe {recipe} (autotune costs tensorwise, delayed and mxfp8)")
        precision = {"tensorwise": "fp8_tensorwise", "delayed": "fp8_delayed", "mxfp8": "mxfp8"}[recipe]
        canon = "e4m3" if recipe == "mxfp8" else "hybrid"
        if fmt != canon:
            r.demote("--fp8-format")
            r.approx.append(f"--fp8-format {fmt} with recipe {recipe}: costed as {canon} (the same GEMM rate), which "
                            "export writes")
        if recipe == "delayed":
            hist, algo = r.value("--fp8-amax-history-len", 1), r.value("--fp8-amax-compute-algo", "most_recent")
            if (hist, algo) != (1024, "max"):
                for o in ("--fp8-amax-history-len", "--fp8-amax-compute-algo"):
                    r.demote(o)
                r.approx.append(f"delayed scaling with amax history {hist}, {algo}: costed the same as export's "
                                "1024, max (the history changes no step time)")
        else:
            for o in ("--fp8-amax-history-len", "--fp8-amax-compute-algo"):
                r.ignore(o, "no effect without the delayed recipe")
        fp8_pg = r.switch("--fp8-param-gather")
    else:
        for o in ("--fp8-recipe", "--fp8-param-gather", "--fp8-amax-history-len", "--fp8-amax-compute-algo"):
            r.ignore(o, "no effect without --fp8-format")
        fp8_pg = False
    bf16_grads = r.switch("--grad-reduce-in-bf16")
    if r.has("--accumulate-allreduce-grads-in-fp32"):
        if bf16_grads:
            raise ConfigError(f"{src}: --accumulate-allreduce-grads-in-fp32 and --grad-reduce-in-bf16 contradict")
        r.ignore("--accumulate-allreduce-grads-in-fp32", "already so with --bf16 (validate_args)")
    # ---- memory ----
    reclaim = "none"
    level = r.args.get("--empty-unused-memory-level", (0,))[0]
    if level == 1:
        r.value("--empty-unused-memory-level")
        reclaim = "empty_cache_per_step"
    elif level == 2:
        reclaim = "empty_cache_per_step"
        r.handled.add("--empty-unused-memory-level")
        r.approx.append("--empty-unused-memory-level 2: a second torch.cuda.empty_cache() after the optimizer "
                        "step; costed as level 1 (once per step)")
    else:
        r.ignore("--empty-unused-memory-level", "0: Megatron-LM's default, no cache emptying")
    if allocator_reclaim(r.env):
        conf = f"PYTORCH_CUDA_ALLOC_CONF={r.env['PYTORCH_CUDA_ALLOC_CONF']}"
        if reclaim == "none":
            reclaim = "expandable_segments"       # what export writes back (megatron_env)
        else:
            r.approx.append(f"{conf} with --empty-unused-memory-level: autotune has one memory reclaim setting; "
                            "costed as empty_cache_per_step")
    # ---- engine-profile settings export writes ----
    if not r.switch("--cross-entropy-loss-fusion"):
        r.approx.append("no --cross-entropy-loss-fusion: the loss is costed fused (the megatron engine profile), which export writes")
    impl = r.value("--transformer-impl", "transformer_engine")
    if impl != "transformer_engine":
        if offload:     # get_cpu_offload_context is Transformer Engine's (megatron/core/transformer/transformer_block.py)
            raise ConfigError(f"{src}: --cpu-offloading-num-layers {offload} needs Transformer Engine; --transformer-impl {impl} refuses it")
        r.demote("--transformer-impl")
        r.approx.append(f"--transformer-impl {impl}: costed with Transformer Engine kernels (the megatron profile)")
    # ---- bucket ----
    base = Plan(grad_reduce_in_bf16=bf16_grads)
    from autotune.spec.engines import engine_for_plan
    per = engine_for_plan("megatron", base).grad_reduce_bytes
    if ogr:
        if r.has("--ddp-num-buckets"):
            n = r.value("--ddp-num-buckets", modelled=False)
            params = math.ceil(model.num_params / (tp * pp)) // max(n, 1)
            r.approx.append(f"--ddp-num-buckets {n}: about {params:,} parameters per bucket (the model's parameters "
                            "/ (TP x PP) / buckets)")
        elif r.has("--ddp-bucket-size"):
            params = r.value("--ddp-bucket-size")
        else:
            params = max(40_000_000, 1_000_000 * dp * cp)
        if params < 1:
            raise ConfigError(f"{src}: --ddp-bucket-size {params}: must be >= 1")
        mib = params * per / 2**20
        bucket = max(1, min(2**20, round(mib)))
        if bucket * 2**20 != params * per or r.has("--ddp-num-buckets"):
            r.demote("--ddp-bucket-size")
            if not r.has("--ddp-num-buckets"):
                r.approx.append(f"DP bucket {params:,} parameters{'' if r.has('--ddp-bucket-size') else ' (Megatron-LM default: max(4e7, 1e6 x DP x CP))'}"
                                f" = {mib:,.2f} MiB of {per}-byte gradients: costed as {bucket} MiB")
    else:
        # Megatron-LM reduces each gradient buffer as one bucket (distributed_data_parallel.py: bucket_size
        # None); the megatron profile costs it so whatever bucket_size_mib says (facts.yaml
        # one_bucket_without_overlap), and export writes no bucket: the plan keeps its default
        why = "no effect without --overlap-grad-reduce (one bucket per gradient buffer)"
        r.ignore("--ddp-bucket-size", why)
        r.ignore("--ddp-num-buckets", why)
        bucket = Plan.__dataclass_fields__["bucket_size_mib"].default
    moe = read_moe_plan(r, model, tp=tp, async_coll=async_coll)
    try:
        workload = Workload(seq_len=seq, global_batch_size=gbs)
        plan = Plan(tp_degree=tp, pp_degree=pp, cp_degree=cp, dp_degree=dp, vpp_degree=vpp, micro_batch_size=mbs,
                    num_micro_batches=gbs // (mbs * dp), pipeline_schedule=schedule, sequence_parallel=sp,
                    recompute=recompute, recompute_num_layers=rnl, zero_stage=zero, async_collectives=async_coll,
                    tp_comm_overlap=tpo, dp_grad_reduce_overlap=ogr, param_gather_overlap=opg,
                    bucket_size_mib=bucket, memory_reclaim=reclaim, stage_layers=stage_layers, precision=precision,
                    grad_reduce_in_bf16=bf16_grads, fp8_param_gather=fp8_pg, recompute_modules=rmods, cpu_offload_layers=offload, **moe)
        plan.layers_per_virtual_stage(L)
        validate_moe(plan, model)       # EP / ETP / dispatcher / overlap rules (Megatron-LM's, spec/moe_plan.py)
    except (ConfigError, PlanError) as e:
        raise ConfigError(f"{src}: {e}") from None
    return plan, workload


def import_megatron_args(path: str | Path, *, num_gpus: int | None, script=None) -> ImportedLaunch:
    """Read a ``pretrain_gpt.py`` argument file (see the module docstring) for ``num_gpus`` GPUs (None: the
    launcher's ``--nnodes`` x ``--nproc-per-node``, :func:`autotune.engines.shell_vars.launcher_world`).
    ``script`` (a :class:`autotune.export.script_run.ScriptRun`, ``--run-script``): run the file under bash
    with its launchers recorded instead of reading it statically.

    Raises:
        ConfigError: a file Megatron-LM's parser would reject, a missing required option, a setting that makes
            it a model or plan autotune cannot simulate (named), degrees / batches that do not divide, a
            ``num_gpus`` other than the launcher's world size, or neither given. A shell script the static
            reader cannot follow says to add ``--run-script``.
    """
    source = str(path)
    notes: list[str] = []
    hint = "" if script is not None or not looks_like_script(path) else RUN_SCRIPT_HINT
    if script is not None:
        tokens, launcher, env, notes = recorded_launch(path, script)
    else:
        try:
            tokens, launcher, env = read_launch(path)
        except ConfigError as e:
            raise ConfigError(f"{e}{hint}") from None
    try:
        world = launcher_world(launcher)
    except ConfigError as e:
        raise ConfigError(f"{source}: {e}") from None
    if world and num_gpus is not None and world[0] != num_gpus:
        raise ConfigError(f"{source}: --gpus {num_gpus} differs from the launch's {world[0]} GPUs ({world[1]}); "
                          f"give --gpus {world[0]} or leave --gpus out")
    for tok in tokens:
        pre = next((p for p in REFUSED_PREFIXES if tok.startswith(p)), None)
        if pre is not None:
            raise ConfigError(f"{source}: {tok.partition('=')[0]}: {REFUSED_PREFIXES[pre]}; autotune simulates "
                              "pretraining steps (forward, backward, optimizer), so it does not predict it")
    try:
        args = parse_megatron_args(tokens, source)
    except ConfigError as e:
        raise ConfigError(f"{e}{hint}") from None
    if num_gpus is None and world is None:
        why = ("the script launches nothing: a config another script sources" if script is not None and not launcher
               else "the launcher words give no literal --nnodes and --nproc-per-node")
        raise ConfigError(f"{source}: give --gpus N, the world size the launch runs on (TP x PP x CP x DP; {why})"
                          + hint)
    num_gpus = num_gpus if num_gpus is not None else world[0]
    r = _Reader(args, source)
    r.env = env
    for opt, (what, active) in REFUSED.items():
        if opt in args and (active is None or active(args[opt])):
            r.refuse(opt, what)
    for opt in no_cost_options():
        r.ignore(opt, NO_COST)
    model = _model(r, label_from_path(path))
    plan, workload = _plan_and_workload(r, model, num_gpus)
    for opt, vals in args.items():
        if opt in r.modelled or opt in r.handled:
            continue
        r.ignored.append((_show(opt, vals), RUN if opt.startswith(RUN_PREFIXES) else NOT_MODELLED))
    if launcher:
        # the allocator setting is modelled (memory_reclaim), not ignored
        words = [w for w in launcher if not (plan.memory_reclaim == "expandable_segments"
                                             and w.startswith("PYTORCH_CUDA_ALLOC_CONF="))]
        if words:
            r.ignored.insert(0, (" ".join(words), "the launcher's words before the script"))
    return ImportedLaunch(source=source, engine="megatron", fmt="megatron args" + (" (script run)" if script else ""),
                          model=model, plan=plan, workload=workload, num_gpus=num_gpus, modelled=dict(r.modelled),
                          ignored=tuple(r.ignored), approximated=tuple(r.approx), notes=tuple(notes))


#: file suffixes this reader claims for ``--from-*`` autodetection: none, it reads what no other format claims
#: (an argument list or launch script of any name)
FILE_SUFFIXES: tuple[str, ...] = ()

__all__ = ["FILE_SUFFIXES", "FACTS_FILE", "NO_COST", "REFUSED", "REFUSED_PREFIXES", "no_cost_options", "import_launch",
           "import_megatron_args", "parse_megatron_args", "parser_facts", "read_args_file",
           "read_launch"]


def import_launch(path: str | Path, *, num_gpus: int | None, script=None) -> ImportedLaunch:
    """The importer part of the engine (:class:`autotune.engines.base.EngineParts`): :func:`import_megatron_args`
    (``num_gpus`` None: the launcher's ``--nnodes`` x ``--nproc-per-node`` gives the world size; ``script``:
    ``--run-script``)."""
    return import_megatron_args(path, num_gpus=num_gpus, script=script)
