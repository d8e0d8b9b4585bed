"""The workload matrix: every service beside every trainer under each sharing configuration, in
rounds, with orion at its defaults (no knobs, no latency target).

  orion_bench.py matrix --bundle DIR [--be gptlm|resnet50] [--repeat N] [--first-round K]
                        [priority's options, which override the matrix's]

Services (high priority, Poisson arrivals at half their capacity alone, latency from the
scheduled arrival): resnet50-graph (ResNet50 batch 4 as a CUDA graph), bert8-graph (a
BERT-base-sized encoder, fp16, batch 8 x 128, CUDA graph, under 1 ms a request), gpt2-decode (a
GPT-2-sized fp16 decoder generating 16 tokens one by one, eager). Trainers (best effort):
resnet50 (batch 64), gptlm (a 12-layer d-1024 language model at 8 x 512 tokens, bf16 autocast,
AdamW). Configurations: orion (priority mode, its defaults: the budget sized to the service),
orion:be_budget_us=500 (the fixed budget it replaces), orion-mps and mps-cap (MPS with the
trainer at 50% of the SMs). One trainer per command (each fits a 9-minute slot); the
results.jsonl of several commands (--first-round to number their rounds) concatenate into one
table: `orion_bench.py priority --table ALL.jsonl`. This is the `priority` experiment with the
options of its `matrix` split.
"""
from experiments import priority

ANSWERS = ("every service (CNN graph, transformer graph, eager decoder) beside every trainer "
           "(CNN, transformer LM) under each sharing configuration, orion at its defaults: "
           "p50, p99, trainer speed, harvest efficiency, medians over rounds")


def main(argv=None):
    return priority.main(["--split", "matrix", *(argv or [])])
