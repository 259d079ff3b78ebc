"""Export the small PyTorch models the tests run (dynamo exporter, opset 18).

    python tools/export_test_models.py   # needs torch + onnxscript; writes tests/data/

Run once by a developer; the ONNX files are committed so CI needs no torch.
"""

from pathlib import Path

import torch
from torch import nn

OUT = Path(__file__).resolve().parents[1] / "tests" / "data"


class Block(nn.Module):
    def __init__(self, c_in, c_out, stride):
        super().__init__()
        self.c1 = nn.Conv2d(c_in, c_out, 3, stride, 1, bias=False)
        self.b1 = nn.BatchNorm2d(c_out)
        self.c2 = nn.Conv2d(c_out, c_out, 3, 1, 1, bias=False)
        self.b2 = nn.BatchNorm2d(c_out)
        self.skip = (nn.Sequential(nn.Conv2d(c_in, c_out, 1, stride, bias=False), nn.BatchNorm2d(c_out))
                     if stride != 1 or c_in != c_out else nn.Identity())

    def forward(self, x):
        y = torch.relu(self.b1(self.c1(x)))
        return torch.relu(self.b2(self.c2(y)) + self.skip(x))


class ResNetish(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 16, 7, 2, 3, bias=False), nn.BatchNorm2d(16), nn.ReLU(),
                                  nn.MaxPool2d(3, 2, 1))
        self.layers = nn.Sequential(Block(16, 16, 1), Block(16, 32, 2), Block(32, 64, 2))
        self.fc = nn.Linear(64, 10)

    def forward(self, x):
        x = self.layers(self.stem(x))
        return self.fc(torch.flatten(nn.functional.adaptive_avg_pool2d(x, 1), 1))


class EncoderLayer(nn.Module):
    def __init__(self, d, h):
        super().__init__()
        self.h = h
        self.qkv = nn.Linear(d, 3 * d)
        self.o = nn.Linear(d, d)
        self.ln1 = nn.LayerNorm(d)
        self.ff = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))
        self.ln2 = nn.LayerNorm(d)

    def forward(self, x, mask):
        b, s, d = x.shape
        q, k, v = self.qkv(x).split(d, dim=-1)
        q, k, v = (t.reshape(b, s, self.h, d // self.h).transpose(1, 2) for t in (q, k, v))
        att = (q @ k.transpose(-1, -2)) / (d // self.h) ** 0.5 + mask
        y = (att.softmax(-1) @ v).transpose(1, 2).reshape(b, s, d)
        x = self.ln1(x + self.o(y))
        return self.ln2(x + self.ff(x))


class Bertish(nn.Module):
    def __init__(self, vocab=100, d=64, h=4, layers=2, max_len=32):
        super().__init__()
        self.tok = nn.Embedding(vocab, d)
        self.pos = nn.Embedding(max_len, d)
        self.ln = nn.LayerNorm(d)
        self.layers = nn.ModuleList(EncoderLayer(d, h) for _ in range(layers))
        self.pool = nn.Linear(d, d)

    def forward(self, input_ids, attention_mask):
        s = input_ids.shape[1]
        pos = torch.arange(s, device=input_ids.device).unsqueeze(0)
        x = self.ln(self.tok(input_ids) + self.pos(pos))
        mask = (1.0 - attention_mask[:, None, None, :].to(x.dtype)) * -10000.0
        for layer in self.layers:
            x = layer(x, mask)
        return x, torch.tanh(self.pool(x[:, 0]))


class GPT2ish(nn.Module):
    """A GPT-2 style decoder run step by step with past key/values."""

    def __init__(self, vocab=100, d=64, h=4, layers=2, max_len=64):
        super().__init__()
        self.h, self.d = h, d
        self.wte = nn.Embedding(vocab, d)
        self.wpe = nn.Embedding(max_len, d)
        self.ln1 = nn.ModuleList(nn.LayerNorm(d) for _ in range(layers))
        self.attn = nn.ModuleList(nn.Linear(d, 3 * d) for _ in range(layers))
        self.proj = nn.ModuleList(nn.Linear(d, d) for _ in range(layers))
        self.ln2 = nn.ModuleList(nn.LayerNorm(d) for _ in range(layers))
        self.mlp = nn.ModuleList(nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(approximate="tanh"),
                                               nn.Linear(4 * d, d)) for _ in range(layers))
        self.lnf = nn.LayerNorm(d)

    def forward(self, input_ids, past_k0, past_v0, past_k1, past_v1):
        past = [(past_k0, past_v0), (past_k1, past_v1)]
        b, s = input_ids.shape
        p = past_k0.shape[2]
        pos = torch.arange(p, p + s, device=input_ids.device).unsqueeze(0)
        x = self.wte(input_ids) + self.wpe(pos)
        hd = self.d // self.h
        causal = torch.ones(s, p + s, dtype=torch.bool).tril(diagonal=p)
        presents = []
        for i in range(len(self.attn)):
            q, k, v = self.attn[i](self.ln1[i](x)).split(self.d, dim=-1)
            q, k, v = (t.reshape(b, s, self.h, hd).transpose(1, 2) for t in (q, k, v))
            k = torch.cat([past[i][0], k], dim=2)
            v = torch.cat([past[i][1], v], dim=2)
            presents += [k, v]
            att = (q @ k.transpose(-1, -2)) / hd ** 0.5
            att = att.masked_fill(~causal, float("-inf")).softmax(-1)
            y = (att @ v).transpose(1, 2).reshape(b, s, self.d)
            x = x + self.proj[i](y)
            x = x + self.mlp[i](self.ln2[i](x))
        logits = self.lnf(x) @ self.wte.weight.T
        return (logits, *presents)


def export(model, args, name, input_names, output_names, dynamic_shapes):
    model.eval()
    torch.manual_seed(0)
    prog = torch.onnx.export(model, args, dynamo=True, opset_version=18, input_names=input_names,
                             output_names=output_names, dynamic_shapes=dynamic_shapes,
                             external_data=False)
    prog.optimize()
    prog.save(str(OUT / f"{name}.onnx"), external_data=False)
    print("wrote", name)


def main():
    OUT.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    r = ResNetish()
    for m in r.modules():  # non-trivial BatchNorm statistics
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.uniform_(-0.1, 0.1)
            m.running_var.uniform_(0.5, 1.5)
    B = torch.export.Dim("batch", min=1, max=64)
    export(r, (torch.randn(2, 3, 64, 64),), "resnetish", ["pixels"], ["logits"],
           {"x": {0: B}})
    S = torch.export.Dim("seq", min=2, max=32)
    export(Bertish(), (torch.randint(0, 100, (2, 16)), torch.ones(2, 16, dtype=torch.int64)),
           "bertish", ["input_ids", "attention_mask"], ["last_hidden_state", "pooler_output"],
           {"input_ids": {0: B, 1: S}, "attention_mask": {0: B, 1: S}})
    P = torch.export.Dim("past", min=1, max=48)
    S2 = torch.export.Dim("seq", min=1, max=16)
    past = [torch.randn(1, 4, 3, 16) for _ in range(4)]
    dyn = {"input_ids": {0: B, 1: S2}}
    for n in ("past_k0", "past_v0", "past_k1", "past_v1"):
        dyn[n] = {0: B, 2: P}
    export(GPT2ish(), (torch.randint(0, 100, (1, 2)), *past), "gpt2ish",
           ["input_ids", "past_key.0", "past_value.0", "past_key.1", "past_value.1"],
           ["logits", "present_key.0", "present_value.0", "present_key.1", "present_value.1"], dyn)


if __name__ == "__main__":
    main()
