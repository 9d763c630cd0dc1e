# A user's own Megatron-LM pretrain_gpt.py arguments for Llama 3.1 70B on 512 H100s (64 nodes x 8),
# written the way Megatron-LM's examples/llama scripts and Megatron-Bridge's llama3_70b recipe set it up:
# the model of meta-llama/Llama-3.1-70B's config.json, TP 8 x PP 4 with interleaving (VPP 4), CP 2,
# sequence parallelism, the distributed optimizer with every overlap on, FP8 (current scaling), seq 8192.
# Test data for `autotune simulate --from-megatron` (tests/export/test_launch_import.py); not a result.

# ---- model ----
--num-layers 80 --hidden-size 8192 --ffn-hidden-size 28672 \
--num-attention-heads 64 --group-query-attention --num-query-groups 8 --kv-channels 128 \
--seq-length 8192 --max-position-embeddings 131072 \
--position-embedding-type rope --rotary-base 500000 --use-rope-scaling --rope-scaling-factor 8 \
--normalization RMSNorm --norm-epsilon 1e-5 --swiglu --disable-bias-linear \
--untie-embeddings-and-output-weights --attention-dropout 0.0 --hidden-dropout 0.0 \
--vocab-size 128256 --make-vocab-size-divisible-by 128 \
--tokenizer-type HuggingFaceTokenizer --tokenizer-model meta-llama/Llama-3.1-70B

# ---- parallelism and memory ----
--tensor-model-parallel-size 8 --pipeline-model-parallel-size 4 \
--num-layers-per-virtual-pipeline-stage 5 --context-parallel-size 2 --sequence-parallel
--micro-batch-size 1 --global-batch-size 512
--use-distributed-optimizer --overlap-grad-reduce --overlap-param-gather --tp-comm-overlap
--ddp-bucket-size 33554432          # 128 MiB of FP32 main grads
--recompute-granularity selective

# ---- precision and kernels ----
--bf16 --fp8-format hybrid --fp8-recipe tensorwise
--cross-entropy-loss-fusion --transformer-impl transformer_engine

# ---- run ----
--train-iters 100000 --lr 1.5e-4 --min-lr 1.5e-5 --lr-decay-style cosine --lr-warmup-iters 2000 \
--weight-decay 0.1 --adam-beta1 0.9 --adam-beta2 0.95 --clip-grad 1.0 --init-method-std 0.008 \
--data-path /data/llama3/text_document --split 99,1,0 --seed 1234 \
--save /checkpoints/llama3.1-70b --load /checkpoints/llama3.1-70b --save-interval 1000 \
--log-interval 10 --eval-interval 1000 --eval-iters 10 --tensorboard-dir /logs/llama3.1-70b
