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

/* ---- The encoder's per-chunk work after change detection ----------------------------
 * Positions' Rice streams straight from the positions (no gaps array), the split levels
 * of the coded values in one pass each, and exact histograms.  Same bytes and integers
 * as the NumPy passes they replace; the floats that steer choices stay in NumPy. */

/* out[j] = the sum of g_i >> (k0 + j) for j < nk (at most 3), over i = 0, step, 2 step,
 * ... < n (n >= 1), g_i the gaps of the increasing positions pos (g_0 = p_0, g_i =
 * p_i - p_{i-1} - 1): the Rice parameter's candidates judged in one pass, without a
 * gaps array.  Unsigned, as gaps are not negative: SSE2 shifts 64-bit lanes only so. */
void wd_gap_quotients(const int64_t *pos, int64_t n, int64_t step, int k0, int nk,
                      int64_t *out) {
    int k1 = k0 + (nk > 1), k2 = k0 + 2 * (nk > 2);
    uint64_t g = (uint64_t)pos[0], s0 = g >> k0, s1 = g >> k1, s2 = g >> k2;
    if (step == 1) {
        for (int64_t i = 1; i < n; i++) {  /* a constant stride, which vectorises */
            g = (uint64_t)(pos[i] - pos[i - 1] - 1);
            s0 += g >> k0, s1 += g >> k1, s2 += g >> k2;
        }
    } else {
        for (int64_t i = step; i < n; i += step) {
            g = (uint64_t)(pos[i] - pos[i - 1] - 1);
            s0 += g >> k0, s1 += g >> k1, s2 += g >> k2;
        }
    }
    uint64_t sums[3] = {s0, s1, s2};
    for (int j = 0; j < nk; j++) out[j] = (int64_t)sums[j];
}

/* k-bit fields (1..31) written LSB first from a register, no branch on the data: after
 * each field the register's 8 bytes are stored and its whole bytes move on (8 bytes of
 * slack past the stream take the last stores).  Fewer than 8 bits stay pending. */
typedef struct {
    uint8_t *out;
    uint64_t acc;
    int filled;
} field_writer;

static inline void field_put(field_writer *f, uint64_t r, int k) {
    f->acc |= r << f->filled; /* fewer than 8 bits pending and k <= 31: they fit */
    f->filled += k;
    memcpy(f->out, &f->acc, 8);
    f->out += f->filled >> 3;
    f->acc >>= 8 * (f->filled >> 3);
    f->filled &= 7;
}

static inline void field_end(field_writer *f) {
    if (f->filled) *f->out = (uint8_t)f->acc;
}

/* The remainder stream of the gaps of n positions, k (1..31) bits each.  For k <= 8
 * eight fields fill exactly k bytes: each group of eight is packed in a register and
 * stored apart, with no chain from one group to the next (measured: 0.5 ns a field
 * against 1.1 for the field writer, whose chain through its register is long). */
static void gap_remainders(const int64_t *pos, int64_t n, int k, uint8_t *out) {
    uint64_t fmask = (1ULL << k) - 1;
    int64_t i = 0;
    if (k <= 8 && n >= 8) {
        uint64_t group = (uint64_t)pos[0] & fmask;
        for (int j = 1; j < 8; j++) group |= ((uint64_t)(pos[j] - pos[j - 1] - 1) & fmask) << (j * k);
        memcpy(out, &group, 8);
        for (i = 8, out += k; i + 8 <= n; i += 8, out += k) {
            group = 0;
            for (int j = 0; j < 8; j++)
                group |= ((uint64_t)(pos[i + j] - pos[i + j - 1] - 1) & fmask) << (j * k);
            memcpy(out, &group, 8);
        }
    }
    field_writer f = {out, 0, 0};
    for (int64_t prev = i ? pos[i - 1] : -1; i < n; prev = pos[i++])
        field_put(&f, (uint64_t)(pos[i] - prev - 1) & fmask, k);
    field_end(&f);
}

/* Both Rice streams of the gaps of the n (>= 1) increasing positions with parameter k
 * (0..31), one after the other in out: the unary stream of ubytes (known from
 * wd_gap_quotients), then the remainder stream of ceil(n * k / 8) bytes, then 8 bytes
 * of slack for its writer. */
void wd_rice_positions(const int64_t *pos, int64_t n, int k, uint8_t *out, int64_t ubytes) {
    memset(out, 0, (size_t)ubytes);
    uint64_t bit = 0;
    for (int64_t i = 0, prev = -1; i < n; prev = pos[i++]) {
        bit += (uint64_t)(pos[i] - prev - 1) >> k;
        out[bit >> 3] |= (uint8_t)(1u << (bit & 7));
        bit++;
    }
    if (k) gap_remainders(pos, n, k, out + ubytes);
}

/* One split level: the n words of rest that are not split, in order, into kept, and the
 * mask of them (bit i set where rest[i] != split, LSB first) into mask, which has room
 * for ceil(n / 64) 8-byte words (the padding is zeroed); returns how many are kept.
 * The mask is the level's unary stream for k = 0 (up to the byte of its last 1 bit),
 * and wd_rice_mask codes it for any other k.  Branch-free: levels keep about half. */
#define SPLIT_MASK(S, T)                                                                \
    static int64_t split_mask##S(const T *rest, int64_t n, T split, T *kept,            \
                                 uint8_t *mask) {                                       \
        int64_t c = 0, i = 0;                                                           \
        for (; i + 8 <= n; i += 8) {                                                    \
            unsigned byte = 0;                                                          \
            for (int j = 0; j < 8; j++) {                                               \
                T v = rest[i + j];                                                      \
                unsigned ne = v != split;                                               \
                byte |= ne << j;                                                        \
                kept[c] = v;                                                            \
                c += ne;                                                                \
            }                                                                           \
            mask[i >> 3] = (uint8_t)byte;                                               \
        }                                                                               \
        memset(mask + (i >> 3), 0, (size_t)((n + 63) / 64 * 8 - (i >> 3)));            \
        for (; i < n; i++) {                                                            \
            unsigned ne = rest[i] != split;                                             \
            mask[i >> 3] |= (uint8_t)(ne << (i & 7));                                   \
            kept[c] = rest[i];                                                          \
            c += ne;                                                                    \
        }                                                                               \
        return c;                                                                       \
    }
FOR_SIZES(SPLIT_MASK)

int64_t wd_split_mask(const void *rest, int64_t n, int size, uint64_t split, void *kept,
                      uint8_t *mask) {
#define CASE(S, T) \
    if (size == S) return split_mask##S((const T *)rest, n, (T)split, (T *)kept, mask);
    FOR_SIZES(CASE)
#undef CASE
    return 0;
}

/* Both Rice streams, parameter k (0..31), of the gaps between the set bits of a mask of
 * words 8-byte words (from wd_split_mask): the unary stream into unary (zeroed here, of
 * ubytes, room for it), the remainders (ceil(c * k / 8) bytes for c set bits, then 8 of
 * slack) into rem.  Returns the unary stream's length in bytes (0 for no set bit). */
int64_t wd_rice_mask(const uint8_t *mask, int64_t words, int k, uint8_t *unary, int64_t ubytes,
                     uint8_t *rem) {
    memset(unary, 0, (size_t)ubytes);
    field_writer f = {rem, 0, 0};
    uint64_t bit = 0, fmask = k ? (1ULL << k) - 1 : 0;
    int64_t prev = -1;
    for (int64_t w = 0; w < words; w++) {
        for (uint64_t bits = load64(mask + 8 * w); bits; bits &= bits - 1) {
            int64_t at = 64 * w + __builtin_ctzll(bits);
            uint64_t g = (uint64_t)(at - prev - 1);
            prev = at;
            bit += g >> k;
            unary[bit >> 3] |= (uint8_t)(1u << (bit & 7));
            bit++;
            if (k) field_put(&f, g & fmask, k);
        }
    }
    field_end(&f);
    return (int64_t)((bit + 7) / 8);
}
