"""An unmodified PyTorch training script: a small transformer block (bf16 autocast, SDPA, fused AdamW), eager.
``python torch_step.py [STEPS]``: prints the loss. gpuscope run profiles it as a user would
(``gpuscope run --set full -s 40 -c 20 --html page.html torch_step.py 10``)."""

import sys
import time

import torch


def main():
    steps = int(sys.argv[1]) if len(sys.argv) > 1 else 10
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(d_model=512, nhead=8, dim_feedforward=2048, batch_first=True).cuda()
    opt = torch.optim.AdamW(layer.parameters(), lr=1e-4, fused=True)
    x = torch.randn(16, 256, 512, device="cuda")
    t0 = time.perf_counter()
    for _ in range(steps):
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = layer(x).float().pow(2).mean()
        loss.backward()
        opt.step()
    torch.cuda.synchronize()
    print(f"loss {loss.item():.6f} after {steps} steps in {time.perf_counter() - t0:.2f} s")


if __name__ == "__main__":
    main()
