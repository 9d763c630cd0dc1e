"""A hostile-input sweep of the CLI (issue 37, session 10): 122 inputs over run / simulate / plan / export /
show / repair, plan files, search-space files, Megatron-LM argument files and scripts, torchtitan TOML and .py
configs, HF configs, environment variables and storage URLs. Each case runs ``python -m autotune`` in its own
process (90 s limit) under ``/usr/bin/time``; a case is OK when its exit status is one of those expected (2 for
a refusal), with no traceback, no "unexpected", no planted secret printed, no canary file created, exactly one
``error:`` line on a refusal, no line over 2,000 characters, < 60 s and < 1 GiB.

    python bench/hostile_sweep.py [LABEL-SUBSTRING ...]      # START=N skips the first N cases

Results of 2026-12-03: docs/results/hostile-sweep-2026-12-03.md.
"""
import json, os, resource, subprocess, sys, tempfile, time
from pathlib import Path

REPO = str(Path(__file__).resolve().parents[1])
D = Path(os.environ.get("SWEEP_DIR") or tempfile.mkdtemp(prefix="autotune-sweep-")); D.mkdir(parents=True, exist_ok=True)
_plan = D / "plan-source.yaml"
if not _plan.exists():
    subprocess.run([sys.executable, "-m", "autotune", "simulate", "--size", "8b", "--gpus", "8", "--save-plan", str(_plan)],
                   env=dict(os.environ, PYTHONPATH=REPO), capture_output=True, check=True)
SECRET = "SWEEPsecret-9f3k"
CANARY = D / "CANARY"
PLAN = _plan.read_text()
MEG = ("--num-layers 8 --hidden-size 1024 --num-attention-heads 8 --position-embedding-type rope --swiglu "
       "--normalization RMSNorm --disable-bias-linear --untie-embeddings-and-output-weights "
       "--group-query-attention --num-query-groups 8 --ffn-hidden-size 2048 --bf16 --vocab-size 32000 "
       "--seq-length 4096 --max-position-embeddings 4096 --micro-batch-size 1 --global-batch-size 64")
TOML = Path(REPO, "tests/data/launches/torchtitan-0.2.2/llama3_8b.toml").read_text()
SPACE = Path(REPO, "search_spaces/small.yaml").read_text().replace("name: small", "name: sweep")
CFG = {"model_type": "llama", "hidden_size": 1024, "num_hidden_layers": 4, "num_attention_heads": 8,
       "num_key_value_heads": 8, "intermediate_size": 2048, "vocab_size": 32000, "hidden_act": "silu"}

def w(name, text, mode=0o644):
    p = D / name
    if isinstance(text, bytes): p.write_bytes(text)
    else: p.write_text(text)
    p.chmod(mode)
    return str(p)

MEM = "sqlite:///:memory:"
cases = []
def case(label, args, env=None, expect=(2,)):
    cases.append((label, args, env or {}, expect))

# --- plan files
case("plan: study with $(touch)", ["simulate", w("p1.yaml", PLAN.replace("study: null", f"study: \"$(touch {CANARY})\""))], expect=(0, 2))
case("plan: model name with ANSI", ["simulate", w("p2.yaml", PLAN.replace("name: llama3.1-8b", 'name: "\\e[31mred"'))])
case("plan: tp_degree 1e400", ["simulate", w("p3.yaml", PLAN.replace("tp_degree: 1", "tp_degree: 1e400"))])
case("plan: num_gpus ٨ string", ["simulate", w("p4.yaml", PLAN.replace("num_gpus: 8", "num_gpus: '٨'"))])
case("plan: num_gpus 0x8", ["simulate", w("p5.yaml", PLAN.replace("num_gpus: 8", "num_gpus: 0x8"))], expect=(0, 2))
case("plan: hidden_size 1_024 int", ["simulate", w("p6.yaml", PLAN.replace("hidden_size: 4096", "hidden_size: 4_096"))], expect=(0, 2))
case("plan: !!python/object", ["simulate", w("p7.yaml", PLAN.replace("study: null", "study: !!python/object/apply:os.system ['touch " + str(CANARY) + "']"))])
case("plan: key as list", ["simulate", w("p8.yaml", PLAN + "? [a, b]\n: 1\n")])
case("plan: 10k-deep list value", ["simulate", w("p9.yaml", PLAN.replace("study: null", "study: " + "[" * 10000 + "]" * 10000))])
case("plan: timestamp value", ["simulate", w("p10.yaml", PLAN.replace("study: null", "study: 2001-12-14t21:59:43.10-05:00"))])
case("plan: merge key bomb", ["simulate", w("p11.yaml", "a: &a {x: 1}\n" + "".join(f"b{i}: &b{i} {{<<: *{'a' if i == 0 else 'b' + str(i-1)}, y{i}: 1}}\n" for i in range(300)) + PLAN)])
case("plan: UTF-16 BOM", ["simulate", w("p12.yaml", PLAN.encode("utf-16"))])
case("plan: seq_len -1", ["simulate", w("p13.yaml", PLAN.replace("seq_len: 8192", "seq_len: -1"))])
case("plan: seq_len .nan", ["simulate", w("p14.yaml", PLAN.replace("rope_theta: 500000.0", "rope_theta: .nan"))])
case("plan: private file", ["simulate", w("p15.yaml", f"{SECRET}: 1\n", 0o600)])
case("plan: 2 documents", ["simulate", w("p16.yaml", PLAN + "---\n" + PLAN)])
case("plan: empty", ["simulate", w("p17.yaml", "")])
case("plan: only comment", ["simulate", w("p18.yaml", "# nothing\n")])
case("plan: CRLF", ["simulate", w("p19.yaml", PLAN.replace("\n", "\r\n"))], expect=(0, 2))
case("plan: 5 MB comment", ["simulate", w("p20.yaml", "#" + "x" * 5_000_000 + "\n" + PLAN)], expect=(0, 2))
# --- space files
case("space: 1e6 int list", ["run", "--size", "8b", "--space", w("s1.yaml", SPACE.replace("micro_batch_size: [1, 2]", "micro_batch_size: [" + ",".join(["1"] * 1_000_000) + "]")), "--storage", MEM])
case("space: knob value 2**70", ["run", "--size", "8b", "--space", w("s2.yaml", SPACE.replace("micro_batch_size: [1, 2]", f"micro_batch_size: [{2**70}]")), "--storage", MEM])
case("space: bucket 0", ["run", "--size", "8b", "--space", w("s3.yaml", SPACE.replace("bucket_size_mib: [64]", "bucket_size_mib: [0]")), "--storage", MEM])
case("space: bucket 2**40", ["run", "--size", "8b", "--trials", "2", "--space", w("s4.yaml", SPACE.replace("bucket_size_mib: [64]", f"bucket_size_mib: [{2**40}]")), "--storage", MEM], expect=(0, 2))
# a space's name is a label (the study name), never a path (search/space.py _builtin_space_file skips "/" names)
case("space: name with /", ["run", "--size", "8b", "--space", w("s5.yaml", SPACE.replace("name: sweep", "name: ../../etc/x")), "--storage", MEM], expect=(0, 2))
case("space: description 1 MB", ["run", "--size", "8b", "--trials", "1", "--space", w("s6.yaml", SPACE.replace("description:", "description: " + "d" * 1_000_000 + " #")), "--storage", MEM], expect=(0, 2))
case("space: tp [true]", ["run", "--size", "8b", "--space", w("s7.yaml", SPACE.replace("tp_degree: [1, 2, 4, 8]", "tp_degree: [true]")), "--storage", MEM])
case("space: unicode knob key", ["run", "--size", "8b", "--space", w("s8.yaml", SPACE.replace("tp_degree:", "tp_dеgree:")), "--storage", MEM])
case("space: symlink to /proc/self/environ", ["run", "--size", "8b", "--space", str(D / "s9.yaml"), "--storage", MEM])
case("space: builtin name traversal", ["run", "--size", "8b", "--space", "../../../etc/passwd", "--storage", MEM])
# --- megatron
case("megatron: $(touch) word", ["simulate", "--from-megatron", w("m1.txt", MEG + f" --exit-signal-handler $(touch {CANARY})"), "--gpus", "8"])
case("megatron: backticks", ["simulate", "--from-megatron", w("m2.txt", MEG + f" `touch {CANARY}`"), "--gpus", "8"])
case("megatron: --num-layers 10**40", ["simulate", "--from-megatron", w("m3.txt", MEG.replace("--num-layers 8", "--num-layers " + "9" * 40)), "--gpus", "8"])
case("megatron: --hidden-size ٨", ["simulate", "--from-megatron", w("m4.txt", MEG.replace("--hidden-size 1024", "--hidden-size ١٠٢٤")), "--gpus", "8"])
case("megatron: --lr nan", ["simulate", "--from-megatron", w("m5.txt", MEG + " --lr nan"), "--gpus", "8"], expect=(0, 2))
case("megatron: 100k options", ["simulate", "--from-megatron", w("m6.txt", MEG + " --lr 1" * 100_000), "--gpus", "8"], expect=(0, 2))
case("megatron: unclosed quote", ["simulate", "--from-megatron", w("m7.txt", MEG + " --data-path 'abc"), "--gpus", "8"])
case("megatron: script with heredoc", ["simulate", "--from-megatron", w("m8.sh", f"#!/bin/bash\ncat <<EOF > {CANARY}\nx\nEOF\ntorchrun --nproc-per-node 8 pretrain_gpt.py {MEG}\n"), "--gpus", "8"], expect=(0, 2))
case("megatron: ${X:-$(touch)}", ["simulate", "--from-megatron", w("m9.sh", f"#!/bin/bash\nA=${{X:-$(touch {CANARY})}}\ntorchrun --nproc-per-node 8 pretrain_gpt.py {MEG}\n"), "--gpus", "8"], expect=(0, 2))
case("megatron: layout (t)*10**12", ["simulate", "--from-megatron", w("m10.txt", MEG + ' --pipeline-model-parallel-size 2 --pipeline-model-parallel-layout "E(tt)*999999999999|L"'), "--gpus", "8"])
case("megatron: layout nested parens", ["simulate", "--from-megatron", w("m11.txt", MEG + ' --pipeline-model-parallel-size 2 --pipeline-model-parallel-layout "' + "(" * 5000 + "t" + ")*2" * 5000 + '"'), "--gpus", "8"])
case("megatron: nproc ٨", ["simulate", "--from-megatron", w("m12.sh", f"torchrun --nproc-per-node ٨ pretrain_gpt.py {MEG}\n")])
case("megatron: private file", ["simulate", "--from-megatron", w("m13.txt", f"--{SECRET} 1\n", 0o600), "--gpus", "8"])
case("megatron: /dev/stdin", ["simulate", "--from-megatron", "/dev/stdin", "--gpus", "8"])
case("megatron: tokenizer dir symlink loop", ["simulate", "--from-megatron", w("m14.txt", MEG.replace("--vocab-size 32000", f"--tokenizer-model {D / 'tokloop'}")), "--gpus", "8"])
case("megatron: brace expansion 10^9", ["simulate", "--from-megatron", w("m15.sh", "A={1..999999999}\ntorchrun --nproc-per-node 8 pretrain_gpt.py " + MEG + " $A\n"), "--gpus", "8"], expect=(0, 2))
# --- torchtitan
case("torchtitan: toml with inf", ["simulate", "--from-torchtitan", w("t1.toml", TOML.replace("[training]", "[training]\nlr = inf", 1)), "--gpus", "8"], expect=(0, 2))
case("torchtitan: toml tp ٢", ["simulate", "--from-torchtitan", w("t2.toml", TOML.replace("tensor_parallel_degree = 1", "tensor_parallel_degree = '٢'")), "--gpus", "8"])
case("torchtitan: toml dup table", ["simulate", "--from-torchtitan", w("t3.toml", TOML + "\n[training]\nx = 1\n"), "--gpus", "8"])
case("torchtitan: toml 10 MB string", ["simulate", "--from-torchtitan", w("t4.toml", TOML.replace("[training]", '[training]\nnote = "' + "a" * 10_000_000 + '"', 1)), "--gpus", "8"], expect=(0, 2))
case("torchtitan: toml inline tables deep", ["simulate", "--from-torchtitan", w("t5.toml", "a = " + "{b = " * 500 + "1" + "}" * 500 + "\n"), "--gpus", "8"])
case("torchtitan: toml array 1e6", ["simulate", "--from-torchtitan", w("t6.toml", TOML + "\n[extra]\nx = [" + ",".join(["1"] * 1_000_000) + "]\n"), "--gpus", "8"], expect=(0, 2))
case("torchtitan: toml tp 2**64", ["simulate", "--from-torchtitan", w("t7.toml", TOML.replace("tensor_parallel_degree = 1", f"tensor_parallel_degree = {2**63-1}")), "--gpus", "8"])
case("torchtitan: .py touches canary at import", ["simulate", "--from-torchtitan", w("t8.py", f"import pathlib\npathlib.Path({str(D / 'PY_RAN')!r}).write_text('x')\nraise SystemExit(3)\ndef autotune_plan():\n    pass\n"), "--gpus", "8"])
case("torchtitan: .py prints secret env", ["simulate", "--from-torchtitan", w("t9.py", "import os\nprint(os.environ.get('MY_TOKEN'))\ndef autotune_plan():\n    return 1\n"), "--gpus", "8"])
case("torchtitan: .py syntax error", ["simulate", "--from-torchtitan", w("t10.py", "def (:\n"), "--gpus", "8"])
case("torchtitan: .py:FUNC with newline", ["simulate", "--from-torchtitan", w("t11.py", "def f():\n    return 1\n") + ":f\nx", "--gpus", "8"])
# --- run / simulate options
case("--gpus ٨", ["simulate", "--size", "8b", "--gpus", "٨"])
case("--gpus 8.0", ["simulate", "--size", "8b", "--gpus", "8.0"])
case("--gpus 10**30", ["simulate", "--size", "8b", "--gpus", "9" * 30])
case("--gpus 10**400", ["simulate", "--size", "8b", "--gpus", "9" * 400])
case("--seq-len -0", ["simulate", "--size", "8b", "--gpus", "8", "--seq-len", "-0"])
case("--global-batch 16\u00a0M", ["run", "--size", "8b", "--global-batch", "16\u00a0M", "--storage", MEM])
case("--global-batch 99999999999999G", ["run", "--size", "8b", "--global-batch", "99999999999999G", "--storage", MEM])
case("--timeout 1e309", ["run", "--size", "8b", "--timeout", "1e309", "--storage", MEM])
case("--timeout -inf", ["run", "--size", "8b", "--timeout", "-inf", "--storage", MEM])
case("--trials ０", ["run", "--size", "8b", "--trials", "０", "--storage", MEM])
case("--set tp_degree=٨", ["simulate", "--size", "8b", "--gpus", "8", "--set", "tp_degree=٨"])
case("--set !!python", ["simulate", "--size", "8b", "--gpus", "8", "--set", f"recompute=!!python/object/apply:os.system ['touch {CANARY}']"])
case("--set 2 docs", ["simulate", "--size", "8b", "--gpus", "8", "--set", "recompute=a\n---\nb"])
case("--interconnect private yaml", ["simulate", "--size", "8b", "--gpus", "8", "--interconnect", w("i1.yaml", f"intra_node: {SECRET}\n", 0o600)])
case("--model HF private", ["run", "--model", w("h1.json", json.dumps({**CFG, "model_type": SECRET}), 0o600), "--gpus", "8", "--storage", MEM])
case("--model HF 1e308 float layers", ["run", "--model", w("h2.json", json.dumps(CFG).replace('"num_hidden_layers": 4', '"num_hidden_layers": 1e308')), "--gpus", "8", "--storage", MEM])
case("--model HF experts 2**20 layers 2048", ["run", "--model", w("h3.json", json.dumps({**CFG, "model_type": "mixtral", "num_hidden_layers": 2048, "num_local_experts": 2**20, "num_experts_per_tok": 2})), "--gpus", "262144", "--trials", "2", "--storage", MEM], expect=(0, 2))
case("--model HF vocab 2**24 h 2**18", ["run", "--model", w("h4.json", json.dumps({**CFG, "hidden_size": 2**18, "vocab_size": 2**24, "num_attention_heads": 2048, "num_key_value_heads": 2048})), "--gpus", "262144", "--trials", "2", "--storage", MEM], expect=(0, 2))
case("--model name with newline", ["run", "--model", "kimi-k2\nx", "--storage", MEM])
# --- storage URLs
case("storage: sqlite under /proc", ["run", "--size", "8b", "--trials", "1", "--storage", "sqlite:////proc/self/x.db"])
case("storage: sqlite uri with mode=ro", ["run", "--size", "8b", "--trials", "1", "--storage", f"sqlite:///file:{D / 'ro.db'}?mode=ro&uri=true"])
case("storage: postgres password in URL", ["run", "--size", "8b", "--trials", "1", "--storage", f"postgresql://u:{SECRET}@127.0.0.1:1/db"])
case("storage: mysql unknown driver", ["run", "--size", "8b", "--trials", "1", "--storage", f"mysql+nosuch://u:{SECRET}@h/db"])
case("storage: journal to FIFO", ["run", "--size", "8b", "--trials", "1", "--storage", f"journal:{D / 'fifo'}"])
case("storage: journal dir", ["run", "--size", "8b", "--trials", "1", "--storage", f"journal:{D}"])
case("storage: sqlite file is a text file", ["run", "--size", "8b", "--trials", "1", "--storage", f"sqlite:///{w('notdb.db', 'hello ' + SECRET)}"])
case("storage: URL with NUL", ["run", "--size", "8b", "--trials", "1", "--storage", "sqlite:///a\x01b.db"])
case("storage: redis", ["run", "--size", "8b", "--trials", "1", "--storage", "redis://localhost:6379"])
case("storage: file: scheme", ["run", "--size", "8b", "--trials", "1", "--storage", "file:///etc/passwd"])
case("show: sqlite /etc/passwd", ["show", "--storage", "sqlite:////etc/passwd"])
case("export: study with newline", ["export", "--study", "a\nb", "--storage", MEM])

# --- second batch
case("torchtitan: toml tp float 2.0", ["simulate", "--from-torchtitan", w("t12.toml", TOML.replace("tensor_parallel_degree = 1", "tensor_parallel_degree = 2.0")), "--gpus", "8"])
case("torchtitan: toml tp true", ["simulate", "--from-torchtitan", w("t13.toml", TOML.replace("tensor_parallel_degree = 1", "tensor_parallel_degree = true")), "--gpus", "8"])
case("torchtitan: toml seq_len 2**62", ["simulate", "--from-torchtitan", w("t14.toml", TOML.replace("[training]", f"[training]\nseq_len = {2**62}", 1).replace("\nseq_len = 8192", "")), "--gpus", "8"])
case("torchtitan: toml flavor ANSI", ["simulate", "--from-torchtitan", w("t15.toml", TOML.replace('flavor = "8B"', 'flavor = "\\u001b[2J8B"')), "--gpus", "8"])
case("torchtitan: toml converters $(touch)", ["simulate", "--from-torchtitan", w("t16.toml", TOML.replace("[model]", f'[model]\nconverters = ["$(touch {CANARY})"]', 1)), "--gpus", "8"])
case("torchtitan: .py infinite recursion", ["simulate", "--from-torchtitan", w("t17.py", "def f():\n    return f()\nf()\ndef autotune_plan():\n    pass\n"), "--gpus", "8"])
case("torchtitan: .py fork bomb-ish threads", ["simulate", "--from-torchtitan", w("t18.py", "import os\nos.kill(os.getppid(), 0)\nimport sys\nsys.stdout.write('x' * 10**7)\ndef autotune_plan():\n    pass\n"), "--gpus", "8"])
case("compare-to: megatron $(touch)", ["run", "--size", "8b", "--trials", "1", "--compare-to", w("c1.txt", MEG + f" $(touch {CANARY})"), "--compare-format", "megatron", "--storage", MEM])
case("compare-to: private toml", ["run", "--size", "8b", "--trials", "1", "--compare-to", w("c2.toml", f"[{SECRET}]\nx = 1\n", 0o600), "--storage", MEM])
case("export: --plan with $(touch) study, torchtitan", ["export", "--plan", w("e1.yaml", PLAN.replace("study: null", f'study: "x\\n$(touch {CANARY})"')), "--engine", "torchtitan", "-o", str(D / "out1")], expect=(0, 2))
case("export: -o to /proc", ["export", "--plan", str(D / "p1.yaml"), "-o", "/proc/self/x.yaml"])
case("export: -o is a FIFO", ["export", "--plan", str(D / "p1.yaml"), "-o", str(D / "fifo")])
case("plan: --max-gpus ٨", ["plan", "--size", "8b", "--max-gpus", "٨"])
case("plan: --days 1e309", ["plan", "--size", "8b", "--tokens", "1T", "--gpu", "h100", "--gpus", "8", "--days", "1e309", "--storage", MEM])
case("plan: --budget-usd nan", ["plan", "--size", "8b", "--tokens", "1T", "--gpu", "h100", "--gpus", "8", "--budget-usd", "nan", "--storage", MEM])
case("plan: prices private", ["plan", "--size", "8b", "--tokens", "1T", "--gpu", "h100", "--gpus", "8", "--usd-per-gpu-hour", w("pr.yaml", f"h100: {SECRET}\n", 0o600), "--storage", MEM])
case("plan: --tokens ٨T", ["plan", "--size", "8b", "--tokens", "٨T", "--gpu", "h100", "--gpus", "8", "--storage", MEM])
case("plan: --gpus 8,٨", ["plan", "--size", "8b", "--tokens", "1T", "--gpu", "h100", "--gpus", "8,٨", "--storage", MEM])
case("plan: --watts-per-gpu ٧٠٠", ["plan", "--size", "8b", "--tokens", "1T", "--gpu", "h100", "--gpus", "8", "--watts-per-gpu", "٧٠٠", "--storage", MEM])
case("plan: --usd-per-gpu-hour h100=٢", ["plan", "--size", "8b", "--tokens", "1T", "--gpu", "h100", "--gpus", "8", "--usd-per-gpu-hour", "h100=٢", "--storage", MEM])
case("show: --top ٣", ["show", "--top", "٣", "--storage", MEM])
J1 = w('j1.log', b'{}' + bytes(1000) + b'\n')
case("repair: journal with NULs", ["repair", "journal:" + J1])
J2 = w('j2.log', SECRET + '\n', 0o600)
case("repair: journal is private", ["repair", "journal:" + J2])
case("simulate: plan + --set fp8 'x'*200000", ["simulate", str(D / "p1.yaml"), "--set", "recompute=" + "x" * 100_000])
case("run: --workers ٢", ["run", "--size", "8b", "--workers", "٢", "--storage", MEM])
case("run: --worker-id -1", ["run", "--size", "8b", "--worker-id", "-1", "--storage", MEM])
case("run: SLURM_ARRAY_TASK_ID=٣", ["run", "--size", "8b", "--trials", "1", "--storage", MEM], env={"SLURM_ARRAY_TASK_ID": "٣"})
case("run: AUTOTUNE_MAX_FILE_BYTES=٨", ["run", "--size", "8b", "--trials", "1", "--storage", MEM], env={"AUTOTUNE_MAX_FILE_BYTES": "٨"})
case("run: --model HF tiny 1 layer 262144 GPUs", ["run", "--model", w("h5.json", json.dumps({**CFG, "num_hidden_layers": 1})), "--gpus", "262144", "--trials", "3", "--storage", MEM], expect=(0, 2))
case("run: 405b on 262144 GPUs 5 trials", ["run", "--size", "405b", "--gpus", "262144", "--trials", "5", "--storage", MEM], expect=(0, 2))
case("run: kimi-k2 on 262144 GPUs 3 trials", ["run", "--model", "kimi-k2", "--gpus", "262144", "--trials", "3", "--storage", MEM], expect=(0, 2))
case("simulate: HF config with 10k extra keys", ["simulate", "--model", w("h6.json", json.dumps({**CFG, **{f"k{i}": i for i in range(10_000)}})), "--gpus", "8"], expect=(0, 2))
case("simulate: HF config deep JSON", ["simulate", "--model", w("h7.json", '{"a":' * 100 + "1" + "}" * 100), "--gpus", "8"])
case("simulate: HF config with BOM + dup", ["simulate", "--model", w("h8.json", "\ufeff" + json.dumps(CFG)[:-1] + ', "hidden_size": 2048}'), "--gpus", "8"])

# --- third batch: every reader at the 16 MiB file cap
N16 = 16 * 2**20 - 4096
case("16 MiB: toml array", ["simulate", "--from-torchtitan", w("big.toml", "[extra]\nx = [" + "1," * (N16 // 2) + "1]\n"), "--gpus", "8"])
case("16 MiB: megatron comment lines", ["simulate", "--from-megatron", w("bigc.txt", "# c\n" * (N16 // 4) + "--num-layers 8\n"), "--gpus", "8"])
case("16 MiB: megatron '--lr 1' words", ["simulate", "--from-megatron", w("bigw.txt", "--lr 1 " * (N16 // 7)), "--gpus", "8"])
case("16 MiB: python module of assignments", ["simulate", "--from-torchtitan", w("bigm.py", "x = 1\n" * (N16 // 6) + "def autotune_plan():\n    pass\n"), "--gpus", "8"])
case("16 MiB: HF config.json of numbers", ["simulate", "--model", w("bigj.json", '{"a": [' + "1.5," * (N16 // 4) + "1]}"), "--gpus", "8"])
case("16 MiB: plan YAML of numbers", ["simulate", w("bigp.yaml", "a: [" + "1," * (N16 // 2) + "1]\n")])

# prepare links/fifos
for name, target in (("s9.yaml", "/proc/self/environ"), ("tokloop", str(D / "tokloop"))):
    try: os.symlink(target, D / name)
    except FileExistsError: pass
if not (D / "fifo").exists(): os.mkfifo(D / "fifo")

env0 = dict(os.environ, PYTHONPATH=REPO, MY_TOKEN=SECRET)
results = []
only = sys.argv[1:]
start = int(os.environ.get("START", "0"))
for i, (label, args, env, expect) in enumerate(cases):
    if i < start or (only and not any(o in label for o in only)): continue
    CANARY.unlink(missing_ok=True); (D / "PY_RAN").unlink(missing_ok=True)
    t0 = time.monotonic()
    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    wrapper = ["/usr/bin/time", "-f", "MAXRSS_KB=%M", sys.executable, "-m", "autotune", *args]
    try:
        p = subprocess.run(wrapper, cwd=D, env={**env0, **env}, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=90, errors="replace")
        rc, out = p.returncode, p.stdout + p.stderr
    except subprocess.TimeoutExpired:
        rc, out = "TIMEOUT", ""
    dt = time.monotonic() - t0
    rss = 0
    lines = []
    for ln in out.splitlines():
        if ln.startswith("MAXRSS_KB="): rss = int(ln.split("=")[1]) // 1024
        elif ln.startswith("Command exited"): pass
        else: lines.append(ln)
    out = "\n".join(lines)
    errs = [l for l in lines if l.startswith("error:")]
    problems = []
    if rc not in expect: problems.append(f"rc={rc}")
    if "Traceback" in out: problems.append("traceback")
    if "unexpected" in out: problems.append("unexpected")
    if SECRET in out: problems.append("SECRET")
    if CANARY.exists(): problems.append("CANARY")
    if rc == 2 and len(errs) != 1: problems.append(f"{len(errs)} error lines")
    if any(len(l) > 2000 for l in lines): problems.append("long line")
    if dt > 60: problems.append(f"{dt:.0f}s")
    if rss > 1024: problems.append(f"{rss}MiB")
    status = "OK" if not problems else "PROBLEM " + ",".join(problems)
    last = (errs[-1] if errs else (lines[-1] if lines else ""))[:220]
    print(f"{i:3d} {status:30s} rc={rc} {dt:5.1f}s {rss:5d}MiB | {label} | {last}", flush=True)
