"""The loss of a pipeweave checkpoint in Hugging Face transformers' GPT2LMHeadModel, computed the
way `train_gpt --eval` computes it: the text cut into windows of T+1 bytes overlapping by one byte,
mean next-byte cross-entropy over every target.

Usage: python hf_eval.py FOLDER TEXT T
FOLDER holds the checkpoint as model.safetensors and its config as config.json (copy FILE and
FILE.config.json there). Needs torch and transformers (pip install torch transformers); the result
for train/tests/fixtures/gpt2 is committed there, so CI needs neither.
"""
import sys, json, torch
from transformers import GPT2LMHeadModel
model = GPT2LMHeadModel.from_pretrained(sys.argv[1]).eval()
text = open(sys.argv[2], "rb").read()
T = int(sys.argv[3])
ids = list(text)
n = (len(ids) - 1) // T
total, count = 0.0, 0
with torch.no_grad():
    for i in range(n):
        w = ids[i*T : i*T + T + 1]
        x = torch.tensor([w[:-1]]); y = torch.tensor([w[1:]])
        logits = model(x).logits
        loss = torch.nn.functional.cross_entropy(logits[0].double(), y[0], reduction="sum")
        total += loss.item(); count += T
print(json.dumps({"eval_loss": total / count, "tokens": count, "transformers": __import__("transformers").__version__, "torch": torch.__version__}))
