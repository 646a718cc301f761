#include "model/deepseek_v41/numpy_random.h"

#include "deepinfer/error.h"

namespace deepinfer::dsv41 {

namespace {

using u128 = unsigned __int128;

// numpy.random.SeedSequence with a single 32-bit entropy word, pool size 4.
class SeedSequence {
public:
    explicit SeedSequence(uint32_t entropy) {
        uint32_t hash_const = kInitA;
        const uint32_t entropy_words[1] = {entropy};
        for (int i = 0; i < 4; ++i) pool_[i] = hashmix(i < 1 ? entropy_words[i] : 0u, hash_const);
        for (int src = 0; src < 4; ++src)
            for (int dst = 0; dst < 4; ++dst)
                if (src != dst) pool_[dst] = mix(pool_[dst], hashmix(pool_[src], hash_const));
    }

    // generate_state(n, uint64): 2n 32-bit words, paired little-endian.
    std::vector<uint64_t> generate_state_u64(int n) const {
        uint32_t hash_const = kInitB;
        std::vector<uint32_t> words(2 * n);
        for (int i = 0; i < 2 * n; ++i) {
            uint32_t v = pool_[i % 4];
            v ^= hash_const;
            hash_const *= kMultB;
            v *= hash_const;
            v ^= v >> 16;
            words[i] = v;
        }
        std::vector<uint64_t> out(n);
        for (int i = 0; i < n; ++i) out[i] = static_cast<uint64_t>(words[2 * i]) | (static_cast<uint64_t>(words[2 * i + 1]) << 32);
        return out;
    }

private:
    static constexpr uint32_t kInitA = 0x43b0d7e5u, kMultA = 0x931e8875u, kInitB = 0x8b51f9ddu, kMultB = 0x58f38dedu;
    static constexpr uint32_t kMixMultL = 0xca01f9ddu, kMixMultR = 0x4973f715u;

    static uint32_t hashmix(uint32_t value, uint32_t& hash_const) {
        value ^= hash_const;
        hash_const *= kMultA;
        value *= hash_const;
        value ^= value >> 16;
        return value;
    }
    static uint32_t mix(uint32_t x, uint32_t y) {
        uint32_t r = kMixMultL * x - kMixMultR * y;
        r ^= r >> 16;
        return r;
    }

    uint32_t pool_[4] = {};
};

// numpy's PCG64 (PCG XSL-RR 128/64 with the default multiplier).
class Pcg64 {
public:
    explicit Pcg64(const SeedSequence& seq) {
        const std::vector<uint64_t> s = seq.generate_state_u64(4);
        const u128 initstate = (static_cast<u128>(s[0]) << 64) | s[1];
        const u128 initseq = (static_cast<u128>(s[2]) << 64) | s[3];
        state_ = 0;
        inc_ = (initseq << 1) | 1;
        step();
        state_ += initstate;
        step();
    }

    uint64_t next64() {
        step();
        const uint64_t value = static_cast<uint64_t>(state_ >> 64) ^ static_cast<uint64_t>(state_);
        const unsigned rot = static_cast<unsigned>(state_ >> 122);
        return (value >> rot) | (value << ((64 - rot) & 63));
    }

    uint32_t next32() {
        if (has_uint32_) {
            has_uint32_ = false;
            return uinteger_;
        }
        const uint64_t next = next64();
        has_uint32_ = true;
        uinteger_ = static_cast<uint32_t>(next >> 32);
        return static_cast<uint32_t>(next & 0xffffffffu);
    }

private:
    void step() {
        const u128 mult = (static_cast<u128>(2549297995355413924ull) << 64) | 4865540595714422341ull;
        state_ = state_ * mult + inc_;
    }

    u128 state_ = 0, inc_ = 0;
    bool has_uint32_ = false;
    uint32_t uinteger_ = 0;
};

// Lemire's bounded integers in [0, rng], as numpy's random_bounded_uint64_fill (unmasked).
uint64_t bounded_lemire_u64(Pcg64& g, uint64_t rng) {
    const uint64_t rng_excl = rng + 1;
    u128 m = static_cast<u128>(g.next64()) * rng_excl;
    uint64_t leftover = static_cast<uint64_t>(m);
    if (leftover < rng_excl) {
        const uint64_t threshold = (UINT64_MAX - rng) % rng_excl;
        while (leftover < threshold) {
            m = static_cast<u128>(g.next64()) * rng_excl;
            leftover = static_cast<uint64_t>(m);
        }
    }
    return static_cast<uint64_t>(m >> 64);
}

uint32_t bounded_lemire_u32(Pcg64& g, uint32_t rng) {
    const uint32_t rng_excl = rng + 1;
    uint64_t m = static_cast<uint64_t>(g.next32()) * rng_excl;
    uint32_t leftover = static_cast<uint32_t>(m);
    if (leftover < rng_excl) {
        const uint32_t threshold = (UINT32_MAX - rng) % rng_excl;
        while (leftover < threshold) {
            m = static_cast<uint64_t>(g.next32()) * rng_excl;
            leftover = static_cast<uint32_t>(m);
        }
    }
    return static_cast<uint32_t>(m >> 32);
}

}  // namespace

std::vector<int64_t> numpy_default_rng_integers(uint32_t seed, int64_t low, int64_t high, int count) {
    DI_CHECK(high > low, "integers: high must exceed low");
    Pcg64 g{SeedSequence(seed)};
    const uint64_t rng = static_cast<uint64_t>(high - low - 1);  // inclusive range, as numpy computes it
    std::vector<int64_t> out(count);
    for (int i = 0; i < count; ++i) {
        uint64_t v;
        if (rng == 0) v = 0;
        else if (rng <= 0xffffffffull) v = rng == 0xffffffffull ? g.next32() : bounded_lemire_u32(g, static_cast<uint32_t>(rng));
        else if (rng == UINT64_MAX) v = g.next64();
        else v = bounded_lemire_u64(g, rng);
        out[i] = low + static_cast<int64_t>(v);
    }
    return out;
}

}  // namespace deepinfer::dsv41
