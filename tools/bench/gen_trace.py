#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Generate a synthetic multi-turn trace in the Mooncake jsonl format.

One JSON object per request, as the Mooncake traces (FAST25-release/traces) give the
conversation trace: "timestamp" (ms from the start), "input_length",
"output_length" (tokens) and "hash_ids" (one id per 512-token block of the
prompt, the partial last block included; equal ids at the same position
mean the same content).

The shape, unlike the Mooncake conversation trace (whose conversations share
little beyond their first block): many conversations, each opening with one
of a few long shared system prompts (whole 512-token blocks, picked with Zipf
popularity), and several turns each; a turn's prompt is the previous turn's
prompt, the previous turn's reply and the user's new text. A block keeps its
id while its content is unchanged: the previous prompt's full blocks keep
theirs, every other block (the previous partial last block, now longer, and
the new text's) gets a fresh id, as a hash over the prefix would give.

Defaults (--seed 1): 3,000 conversations over 60 minutes (Poisson
arrivals); 8 system prompts of 8 to 24 blocks, Zipf exponent 1.0; 1 to 8
turns a conversation (uniform); user text 128 to 3,072 tokens a turn, replies
32 to 1,024 tokens (uniform); think time between turns 30 to 300 s (uniform).
That gives 13,390 requests, 64,170 distinct blocks and 185.6M prompt
tokens; a prompt is 13.9k tokens on average, 7.4k of them (53 %) a system
prompt. The program prints the trace's request count, distinct blocks and
prompt tokens on stderr, and the pool of 5 % of the distinct blocks that
the 4-node replay gives each node (docs/EVICTION.md).

Python 3 standard library only; the same arguments give the same file.
"""

import argparse
import json
import random
import sys

BLOCK = 512


def parse_range(text):
    lo, _, hi = text.partition("-")
    lo, hi = int(lo), int(hi or lo)
    if lo < 0 or hi < lo:
        raise argparse.ArgumentTypeError("expected LO-HI with 0 <= LO <= HI: " + text)
    return lo, hi


def main(argv=None):
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seed", type=int, default=1, help="random seed (default 1)")
    p.add_argument("--conversations", type=int, default=3000,
                   help="number of conversations (default 3000)")
    p.add_argument("--duration-s", type=float, default=3600.0,
                   help="conversations start over this many seconds (default 3600)")
    p.add_argument("--prompts", type=int, default=8,
                   help="number of shared system prompts (default 8)")
    p.add_argument("--prompt-blocks", type=parse_range, default=(8, 24),
                   help="a system prompt's length in 512-token blocks, LO-HI (default 8-24)")
    p.add_argument("--zipf", type=float, default=1.0,
                   help="Zipf exponent of the system prompts' popularity (default 1.0)")
    p.add_argument("--turns", type=parse_range, default=(1, 8),
                   help="turns per conversation, LO-HI, uniform (default 1-8)")
    p.add_argument("--user-tokens", type=parse_range, default=(128, 3072),
                   help="user's new text per turn in tokens, LO-HI (default 128-3072)")
    p.add_argument("--reply-tokens", type=parse_range, default=(32, 1024),
                   help="reply (output_length) per turn in tokens, LO-HI (default 32-1024)")
    p.add_argument("--think-s", type=parse_range, default=(30, 300),
                   help="seconds between a reply and the next turn, LO-HI (default 30-300)")
    p.add_argument("-o", "--output", default="-", help="output file (default stdout)")
    a = p.parse_args(argv)
    if a.conversations < 1 or a.prompts < 1 or a.prompt_blocks[0] < 1 or a.turns[0] < 1:
        p.error("--conversations, --prompts, --prompt-blocks and --turns need at least 1")

    rng = random.Random(a.seed)
    next_id = 0

    def fresh():
        nonlocal next_id
        next_id += 1
        return next_id - 1

    # The system prompts: whole blocks, ids 0 .. sum - 1.
    prompts = []
    for _ in range(a.prompts):
        n = rng.randint(*a.prompt_blocks)
        prompts.append([fresh() for _ in range(n)])
    weights = [1.0 / (k + 1) ** a.zipf for k in range(a.prompts)]

    # Conversation starts: a Poisson process over the duration.
    rate = a.conversations / a.duration_s
    starts, t = [], 0.0
    for _ in range(a.conversations):
        t += rng.expovariate(rate)
        starts.append(t)

    reqs = []  # (timestamp_ms, conversation, turn, input_length, output_length, ids)
    for c, start in enumerate(starts):
        sys_ids = prompts[rng.choices(range(a.prompts), weights)[0]]
        ids = list(sys_ids)
        length = len(sys_ids) * BLOCK
        now = start
        for turn in range(rng.randint(*a.turns)):
            length += rng.randint(*a.user_tokens)
            # Blocks past the last full one unchanged since the previous
            # prompt get fresh ids (the previous partial block included).
            ids = ids[:prev_len // BLOCK] if turn else ids
            while len(ids) * BLOCK < length:
                ids.append(fresh())
            reply = rng.randint(*a.reply_tokens)
            reqs.append((int(now * 1000), c, turn, length, reply, list(ids)))
            prev_len = length
            length += reply
            # The reply takes about 20 ms a token, then the user thinks.
            now += reply * 0.02 + rng.uniform(*a.think_s)

    reqs.sort(key=lambda r: (r[0], r[1], r[2]))
    out = sys.stdout if a.output == "-" else open(a.output, "w", encoding="ascii")
    for ts, _, _, inp, outp, ids in reqs:
        out.write(json.dumps({"timestamp": ts, "input_length": inp, "output_length": outp,
                              "hash_ids": ids}) + "\n")
    if out is not sys.stdout:
        out.close()

    distinct = len({i for r in reqs for i in r[5]})
    tokens = sum(r[3] for r in reqs)
    pool = round(distinct * 0.05)
    print("gen_trace: %d requests, %d conversations, %d distinct blocks, %.1fM prompt tokens; "
          "5 %% of distinct: --cap-units %d (4x: %d)"
          % (len(reqs), a.conversations, distinct, tokens / 1e6, pool, 4 * pool),
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
