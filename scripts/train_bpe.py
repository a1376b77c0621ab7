#!/usr/bin/python3
"""Learns a GPT-2-style byte-level BPE from a text and writes it as GPT-2's two files,
vocab.json and merges.txt, which `cohort sample --tokenizer DIR` and cohort.Tokenizer read.

    PYTHONPATH=build/release/python scripts/train_bpe.py datasets/tinyshakespeare/input.txt \
        runs/bpe --merges 512

The text is cut by GPT-2's pre-tokenizer (cohort.pieces, the same pattern the tokenizer uses);
then, --merges times, the most frequent adjacent pair of tokens within the pieces is merged (ties:
the pair whose bytes sort first). The vocabulary is the 256 bytes (ids 0-255, in byte order, as
GPT-2's characters), then the merges in order, then "<|endoftext|>". Deterministic: the same text
gives the same files.
"""
import argparse
import collections
import json
import os

import cohort


def byte_characters():
    """GPT-2's bytes_to_unicode: byte -> the character standing for it."""
    printable = [b for b in range(256) if 33 <= b <= 126 or 161 <= b <= 172 or 174 <= b <= 255]
    out, extra = {}, 0
    for b in range(256):
        if b in printable:
            out[b] = chr(b)
        else:
            out[b] = chr(256 + extra)
            extra += 1
    return out


def learn(pieces, merges):
    """The `merges` most frequent pairs, in order, over words (tuples of byte strings) counted."""
    words = collections.Counter(tuple(bytes([b]) for b in piece) for piece in pieces)
    vocab = list(words)  # word index -> its current tokens
    freq = [words[w] for w in vocab]
    vocab = [list(w) for w in vocab]
    pairs = collections.Counter()
    where = collections.defaultdict(set)  # pair -> the words that hold it
    for i, w in enumerate(vocab):
        for a, b in zip(w, w[1:]):
            pairs[(a, b)] += freq[i]
            where[(a, b)].add(i)
    learned = []
    for _ in range(merges):
        if not pairs:
            break
        best = min(pairs.items(), key=lambda kv: (-kv[1], kv[0]))[0]
        if pairs[best] < 2:
            break
        learned.append(best)
        merged = best[0] + best[1]
        for i in sorted(where.pop(best, ())):
            w = vocab[i]
            for a, b in zip(w, w[1:]):  # this word's pairs leave the counts...
                pairs[(a, b)] -= freq[i]
                if pairs[(a, b)] <= 0:
                    del pairs[(a, b)]
            out, j = [], 0
            while j < len(w):
                if j + 1 < len(w) and (w[j], w[j + 1]) == best:
                    out.append(merged)
                    j += 2
                else:
                    out.append(w[j])
                    j += 1
            vocab[i] = out
            for a, b in zip(out, out[1:]):  # ...and its new ones come back
                pairs[(a, b)] += freq[i]
                where[(a, b)].add(i)
    return learned


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("text")
    p.add_argument("out")
    p.add_argument("--merges", type=int, default=512)
    a = p.parse_args()
    with open(a.text, "rb") as f:
        text = f.read()
    learned = learn(cohort.pieces(text), a.merges)
    chars = byte_characters()

    def shown(token):
        return "".join(chars[b] for b in token)

    vocab = {shown(bytes([b])): b for b in range(256)}
    for first, second in learned:
        vocab.setdefault(shown(first + second), len(vocab))
    vocab["<|endoftext|>"] = len(vocab)
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "vocab.json"), "w", encoding="utf-8") as f:
        json.dump(vocab, f, ensure_ascii=False)
    with open(os.path.join(a.out, "merges.txt"), "w", encoding="utf-8") as f:
        f.write("#version: 0.2\n")
        for first, second in learned:
            f.write(f"{shown(first)} {shown(second)}\n")
    print(f"train_bpe: {len(learned)} merges, {len(vocab)} tokens -> {a.out}/vocab.json, merges.txt")


if __name__ == "__main__":
    main()
