"""A plain PyTorch policy-gradient loop on masreplay advantages (no trainer framework).

Each event of a sampled GRPO group is one row the policy generated (one agent step); its
response is a few tokens. masreplay gives each event its agent-wise advantage (Dr. MAS) and
its loss weight (1/traces x 1/agents x token share, so a wide fan-out does not drown a
narrow trace); ``expand_to_tokens`` spreads the advantages over the generated tokens. The
"policy" is a toy: logits over a 32-token vocabulary from the event type. Needs torch.

    python examples/torch_loop.py
"""

from __future__ import annotations

import numpy as np

import masreplay
from masreplay.integrations.torch import expand_to_tokens

VOCAB, MAX_TOKENS, STEPS = 32, 8, 5


def main() -> None:
    try:
        import torch
    except ImportError:
        raise SystemExit("this example needs the 'torch' package (pip install torch)") from None
    torch.manual_seed(0)
    buffer = masreplay.GraphBuffer(256, seed=0)
    buffer.add(masreplay.sim.generate(256, agents=(2, 6), group_size=8, seed=0))
    policy = torch.nn.Embedding(10, VOCAB)  # event type code -> next-token logits
    optimizer = torch.optim.SGD(policy.parameters(), lr=0.1)
    rng = np.random.default_rng(0)
    for step in range(STEPS):
        batch = buffer.sample_groups(4, group_size=8, seed=step)
        adv = masreplay.advantages(batch, normalize_by="agent", unit="events")
        types, _ = batch.flat("type")
        counts, present, _ = batch.padded("tokens", 1)
        tokens = np.clip(counts[present], 1, MAX_TOKENS)  # each step's generated tokens, capped
        mask = torch.from_numpy(np.arange(MAX_TOKENS)[None, :] < tokens[:, None])
        generated = torch.from_numpy(rng.integers(0, VOCAB, size=(len(types), MAX_TOKENS)))
        logp = torch.log_softmax(policy(torch.from_numpy(types.astype(np.int64))), dim=-1)
        token_logp = logp.unsqueeze(1).expand(-1, MAX_TOKENS, -1).gather(-1, generated.unsqueeze(-1)).squeeze(-1)
        token_adv = expand_to_tokens(torch.from_numpy(adv.per_event), mask)
        # Each event's weight is spread evenly over its generated tokens.
        token_weight = expand_to_tokens(torch.from_numpy(adv.weights) / mask.sum(-1), mask)
        loss = -(token_adv * token_logp * token_weight).sum() / 4  # mean over the 4 groups
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        print(f"step {step}: {len(batch)} traces, {len(types)} agent steps, loss {loss.item():+.4f}")


if __name__ == "__main__":
    main()
