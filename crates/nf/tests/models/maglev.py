#!/usr/bin/env python3
"""Maglev's lookup table (Eisenbud et al., NSDI 2016, section 3.4) from the rule documented in
crates/nf/src/maglev.rs, written independently of it: each backend's preference list is
(offset + j * skip) mod M with offset = h1(name) mod M, skip = h2(name) mod (M - 1) + 1, h1 and
h2 64-bit FNV-1a over the name from two offset bases; the table fills in rounds, each backend
taking, once per unit of weight, its next preferred empty entry.

    maglev.py M NAME:WEIGHT ...   prints the table, one backend index per entry (-1: none)
"""
import sys

MASK = (1 << 64) - 1
H1, H2, PRIME = 0xCBF29CE484222325, 0x84222325CBF29CE4, 0x100000001B3


def fnv1a(basis, data):
    h = basis
    for b in data:
        h = ((h ^ b) * PRIME) & MASK
    return h


def table(m, backends):
    t = [-1] * m
    if all(w == 0 for _, w in backends):
        return t
    perm = [(fnv1a(H1, n.encode()) % m, fnv1a(H2, n.encode()) % (m - 1) + 1) for n, _ in backends]
    nxt = [0] * len(backends)
    filled = 0
    while True:
        for i, (_, w) in enumerate(backends):
            for _ in range(w):
                off, skip = perm[i]
                e = (off + nxt[i] * skip) % m
                while t[e] != -1:
                    nxt[i] += 1
                    e = (off + nxt[i] * skip) % m
                t[e] = i
                nxt[i] += 1
                filled += 1
                if filled == m:
                    return t


if __name__ == "__main__":
    m = int(sys.argv[1])
    bs = [(a.rsplit(":", 1)[0], int(a.rsplit(":", 1)[1])) for a in sys.argv[2:]]
    print(" ".join(str(x) for x in table(m, bs)))
