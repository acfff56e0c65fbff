"""csrc/common/random.h written out in Python: splitmix64 and xoshiro256** with Lemire's bounded draw, so tests can
check a native op's random choices draw for draw."""
from __future__ import annotations

MASK32 = (1 << 32) - 1
MASK64 = (1 << 64) - 1


def splitmix64(x: int) -> int:
    x = (x + 0x9E3779B97F4A7C15) & MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & MASK64
    return x ^ (x >> 31)


def rotl(x: int, k: int) -> int:
    return ((x << k) | (x >> (64 - k))) & MASK64


class Xoshiro256:
    """csrc/common/random.h in Python."""

    def __init__(self, seed: int) -> None:
        self.state = []
        for _ in range(4):
            seed = splitmix64(seed)
            self.state.append(seed)

    def next(self) -> int:
        s = self.state
        result = (rotl((s[1] * 5) & MASK64, 7) * 9) & MASK64
        t = (s[1] << 17) & MASK64
        s[2] ^= s[0]
        s[3] ^= s[1]
        s[1] ^= s[2]
        s[0] ^= s[3]
        s[2] ^= t
        s[3] = rotl(s[3], 45)
        return result

    def below(self, bound: int) -> int:
        assert bound <= MASK32
        product = (self.next() >> 32) * bound
        if (product & MASK32) < bound:
            threshold = ((-bound) & MASK32) % bound
            while (product & MASK32) < threshold:
                product = (self.next() >> 32) * bound
        return product >> 32
