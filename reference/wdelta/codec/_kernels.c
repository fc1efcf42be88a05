/* wdelta's optional compiled kernels (loaded by wdelta/codec/native.py through ctypes).
 *
 * Each function is an exact, fused equivalent of a few NumPy passes of the reference
 * codec: same results, one pass, no temporaries.  They never parse delta bytes: every
 * buffer and length they receive was allocated or validated by the Python side
 * (positions strictly increasing and below the chunk size, buffers of the stated
 * lengths).  Plain C with no Python API, so one build serves every Python version, and
 * ctypes releases the GIL around each call: the encoder's and decoder's threads run
 * these kernels in parallel.
 */
#include <stdint.h>
#include <string.h>

/* Stored words of 1, 2, 4 or 8 bytes, little-endian as in the files. */
#define FOR_SIZES(X) X(1, uint8_t) X(2, uint16_t) X(4, uint32_t) X(8, uint64_t)

static inline uint64_t load64(const uint8_t *p) {
    uint64_t v;
    memcpy(&v, p, 8);
    return v;
}

/* The top bit of every size-byte lane of x that is not zero, the other bits clear. */
static inline uint64_t nonzero_lanes(uint64_t x, uint64_t high) {
    uint64_t low = ~high;
    return (((x & low) + low) | x) & high;
}

/* One pass over a chunk: the positions where the size-byte elements of base and target
 * differ, in increasing order, and at each the words of both transforms, t ^ b and
 * zigzag(t - b), into outputs with room for cap; returns how many, or -1 as soon as
 * more than cap differ (the outputs are then partial).  64 bytes are
 * compared at a time and skipped when equal; in a block that differs, each differing
 * element is found from the set bits of its words' lane masks. */
#define CHANGES(S, T, HIGH)                                                             \
    static int64_t changes##S(const T *b, const T *t, int64_t m, int64_t cap, int64_t *pos, \
                              T *xr, T *sb) {                                           \
        int64_t n = 0, i = 0;                                                           \
        const int per = 8 / S, block = 64 / S;                                          \
        for (; i + block <= m; i += block) {                                            \
            uint64_t x[8], any = 0;                                                     \
            for (int w = 0; w < 8; w++) {                                               \
                x[w] = load64((const uint8_t *)(b + i) + 8 * w) ^                       \
                       load64((const uint8_t *)(t + i) + 8 * w);                        \
                any |= x[w];                                                            \
            }                                                                           \
            if (!any) continue;                                                         \
            for (int w = 0; w < 8; w++) {                                               \
                uint64_t lanes = nonzero_lanes(x[w], HIGH);                             \
                while (lanes) {                                                         \
                    if (n == cap) return -1;                                            \
                    int64_t e = i + w * per + __builtin_ctzll(lanes) / (8 * S);         \
                    T d = (T)(t[e] - b[e]);                                             \
                    pos[n] = e;                                                         \
                    xr[n] = (T)(t[e] ^ b[e]);                                           \
                    sb[n] = (T)((T)(d << 1) ^ (T)(0 - (d >> (8 * S - 1))));             \
                    n++;                                                                \
                    lanes &= lanes - 1;                                                 \
                }                                                                       \
            }                                                                           \
        }                                                                               \
        for (; i < m; i++) {                                                            \
            if (b[i] == t[i]) continue;                                                 \
            if (n == cap) return -1;                                                    \
            T d = (T)(t[i] - b[i]);                                                     \
            pos[n] = i;                                                                 \
            xr[n] = (T)(t[i] ^ b[i]);                                                   \
            sb[n] = (T)((T)(d << 1) ^ (T)(0 - (d >> (8 * S - 1))));                     \
            n++;                                                                        \
        }                                                                               \
        return n;                                                                       \
    }
CHANGES(1, uint8_t, 0x8080808080808080ULL)
CHANGES(2, uint16_t, 0x8000800080008000ULL)
CHANGES(4, uint32_t, 0x8000000080000000ULL)
CHANGES(8, uint64_t, 0x8000000000000000ULL)

int64_t wd_find_changes(const void *base, const void *target, int64_t m, int64_t cap, int size,
                   int64_t *pos, void *xr, void *sb) {
#define CASE(S, T)                                                                      \
    if (size == S)                                                                      \
        return changes##S((const T *)base, (const T *)target, m, cap, pos, (T *)xr, (T *)sb);
    FOR_SIZES(CASE)
#undef CASE
    return 0;
}

/* source[pos[i]] = source[pos[i]] ^ v, + unzigzag(v) (forwards) or - unzigzag(v)
 * (reverse), for the n words v of values.  Positions are strictly increasing and below
 * m (checked by the caller); returns the index of the first one that is not, else -1. */
#define APPLY(S, T)                                                                     \
    static int64_t apply##S(T *src, int64_t m, const int64_t *pos, int64_t n, const T *v, \
                            int sub, int reverse) {                                     \
        for (int64_t i = 0; i < n; i++) {                                               \
            int64_t p = pos[i];                                                         \
            if (p < 0 || p >= m) return i;                                              \
            T w = v[i];                                                                 \
            if (!sub) {                                                                 \
                src[p] ^= w;                                                            \
                continue;                                                               \
            }                                                                           \
            T d = (T)((T)(w >> 1) ^ (T)(0 - (w & 1)));                                  \
            src[p] = reverse ? (T)(src[p] - d) : (T)(src[p] + d);                       \
        }                                                                               \
        return -1;                                                                      \
    }
FOR_SIZES(APPLY)

int64_t wd_apply(void *source, int64_t m, const int64_t *pos, int64_t n, const void *values,
                 int size, int sub, int reverse) {
#define CASE(S, T) \
    if (size == S) return apply##S((T *)source, m, pos, n, (const T *)values, sub, reverse);
    FOR_SIZES(CASE)
#undef CASE
    return 0;
}

/* The bitmap of ceil(m / 8) bytes (nbytes) with bit pos[i] set, LSB first. */
void wd_bitmap(const int64_t *pos, int64_t n, uint8_t *out, int64_t nbytes) {
    memset(out, 0, (size_t)nbytes);
    for (int64_t i = 0; i < n; i++) out[pos[i] >> 3] |= (uint8_t)(1u << (pos[i] & 7));
}

/* Sum of gaps[i] >> k: the unary stream holds that many zero bits plus one 1 bit per gap. */
int64_t wd_quotients(const int64_t *gaps, int64_t n, int k) {
    int64_t s = 0;
    for (int64_t i = 0; i < n; i++) s += gaps[i] >> k;
    return s;
}

/* Sum of gaps[i] >> k over every step-th gap (i = 0, step, 2 step, ... < n): the Rice
 * parameter's judge on a strided sample, without copying it. */
int64_t wd_sample_quotients(const int64_t *gaps, int64_t n, int64_t step, int k) {
    int64_t s = 0;
    for (int64_t i = 0; i < n; i += step) s += gaps[i] >> k;
    return s;
}

/* Both Rice streams of the gaps with parameter k (0..31): the unary stream (ubytes, its
 * size from wd_quotients) and the remainder stream of ceil(n * k / 8) bytes, LSB first,
 * padding bits zero. */
void wd_rice(const int64_t *gaps, int64_t n, int k, uint8_t *unary, int64_t ubytes,
             uint8_t *rem) {
    memset(unary, 0, (size_t)ubytes);
    uint64_t bit = 0, acc = 0;
    int filled = 0;
    uint64_t mask = k ? ((1ULL << k) - 1) : 0;
    for (int64_t i = 0; i < n; i++) {
        bit += (uint64_t)(gaps[i] >> k);
        unary[bit >> 3] |= (uint8_t)(1u << (bit & 7));
        bit++;
        if (!k) continue;
        acc |= ((uint64_t)gaps[i] & mask) << filled;
        filled += k;
        while (filled >= 8) {
            *rem++ = (uint8_t)acc;
            acc >>= 8;
            filled -= 8;
        }
    }
    if (filled) *rem = (uint8_t)acc;
}

/* counts[j * 256 + v] += how many of the n size-byte words hold byte v in plane j (byte j,
 * least significant first): the byte-plane histograms of the transform pick's estimate. */
void wd_plane_counts(const uint8_t *words, int64_t n, int size, int64_t *counts) {
    for (int64_t i = 0; i < n; i++)
        for (int j = 0; j < size; j++) counts[j * 256 + words[i * size + j]]++;
}

/* One split level of the coded values: the indices of the n words of rest that are not
 * split, in increasing order, into keep, and those words into kept; returns how many. */
#define SPLIT(S, T)                                                                     \
    static int64_t split##S(const T *rest, int64_t n, T split, int64_t *keep, T *kept) { \
        int64_t c = 0;                                                                  \
        for (int64_t i = 0; i < n; i++) {                                               \
            keep[c] = i;                                                                \
            kept[c] = rest[i];                                                          \
            c += rest[i] != split;                                                      \
        }                                                                               \
        return c;                                                                       \
    }
FOR_SIZES(SPLIT)

int64_t wd_split(const void *rest, int64_t n, int size, uint64_t split, int64_t *keep,
                 void *kept) {
#define CASE(S, T) \
    if (size == S) return split##S((const T *)rest, n, (T)split, keep, (T *)kept);
    FOR_SIZES(CASE)
#undef CASE
    return 0;
}
