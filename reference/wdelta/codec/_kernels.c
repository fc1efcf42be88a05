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
 * least significant first): the byte-plane histograms of the transform pick's estimate.
 * Four neighbouring words count into four tables: a plane's bytes are mostly one value,
 * and one table would chain each increment to the last (measured: 12 against 20 us for
 * 16K bf16 words).  The bytes are read from memory, in the files' order. */
#define PLANE_COUNTS(S, T)                                                              \
    static void plane_counts##S(const uint8_t *words, int64_t n, int64_t *counts) {     \
        uint32_t t[4][S * 256];                                                         \
        memset(t, 0, sizeof t);                                                         \
        int64_t i = 0;                                                                  \
        for (; i + 4 <= n; i += 4) {                                                    \
            uint8_t b[4 * S];                                                           \
            memcpy(b, words + i * S, 4 * S);                                            \
            for (int r = 0; r < 4; r++)                                                 \
                for (int j = 0; j < S; j++) t[r][j * 256 + b[r * S + j]]++;             \
        }                                                                               \
        for (; i < n; i++)                                                              \
            for (int j = 0; j < S; j++) t[0][j * 256 + words[i * S + j]]++;             \
        for (int v = 0; v < S * 256; v++)                                               \
            counts[v] += (int64_t)t[0][v] + t[1][v] + t[2][v] + t[3][v];                \
    }
FOR_SIZES(PLANE_COUNTS)

void wd_plane_counts(const uint8_t *words, int64_t n, int size, int64_t *counts) {
#define CASE(S, T) \
    if (size == S) plane_counts##S(words, n, counts);
    FOR_SIZES(CASE)
#undef CASE
}

/* ---- The encoder's per-chunk work after change detection ----------------------------
 * Positions' Rice streams straight from the positions (no gaps array), the split levels
 * of the coded values in one pass each, and exact histograms.  Same bytes and integers
 * as the NumPy passes they replace; the floats that steer choices stay in NumPy. */

/* out[j] = the sum of g_i >> (k0 + j) for j < nk (at most 3), over i = 0, step, 2 step,
 * ... < n (n >= 1), g_i the gaps of the increasing positions pos (g_0 = p_0, g_i =
 * p_i - p_{i-1} - 1): the Rice parameter's candidates judged in one pass, without a
 * gaps array; for step 1 or 2 also out[3 + j] = the sum over all gaps (the chosen k's
 * exact size), from the same pass, else -1.  Unsigned, as gaps are not negative: SSE2
 * shifts 64-bit lanes only so, and the loops of step 1 and 2 vectorise (step 2 as
 * pairs of one sampled and one other gap: measured 62 us for 165K gaps, against 120
 * for a strided pass and a full one). */
void wd_gap_quotients(const int64_t *pos, int64_t n, int64_t step, int k0, int nk,
                      int64_t *out) {
    int k1 = k0 + (nk > 1), k2 = k0 + 2 * (nk > 2);
    uint64_t g = (uint64_t)pos[0], s0 = g >> k0, s1 = g >> k1, s2 = g >> k2;
    uint64_t o0 = 0, o1 = 0, o2 = 0; /* the gaps outside the sample, for step 2 */
    int64_t i = step;
    if (step == 1) {
        for (; i < n; i++) {
            g = (uint64_t)(pos[i] - pos[i - 1] - 1);
            s0 += g >> k0, s1 += g >> k1, s2 += g >> k2;
        }
    } else if (step == 2) {
        for (i = 1; i + 1 < n; i += 2) {
            uint64_t go = (uint64_t)(pos[i] - pos[i - 1] - 1);
            uint64_t gs = (uint64_t)(pos[i + 1] - pos[i] - 1);
            o0 += go >> k0, o1 += go >> k1, o2 += go >> k2;
            s0 += gs >> k0, s1 += gs >> k1, s2 += gs >> k2;
        }
        if (i < n) {
            g = (uint64_t)(pos[i] - pos[i - 1] - 1);
            o0 += g >> k0, o1 += g >> k1, o2 += g >> k2;
        }
    } else if (nk == 1 && k0 == 0) { /* a sample's mean: its gaps' sum, no shifts */
        for (; i < n; i += step) s0 += (uint64_t)(pos[i] - pos[i - 1] - 1);
    } else {
        for (; i < n; i += step) {
            g = (uint64_t)(pos[i] - pos[i - 1] - 1);
            s0 += g >> k0, s1 += g >> k1, s2 += g >> k2;
        }
    }
    uint64_t sums[3] = {s0, s1, s2}, others[3] = {o0, o1, o2};
    for (int j = 0; j < nk; j++) {
        out[j] = (int64_t)sums[j];
        out[3 + j] = step <= 2 ? (int64_t)(sums[j] + others[j]) : -1;
    }
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

/* Both Rice streams of the gaps of the n (>= 1) increasing positions with parameter k
 * (0..31), one after the other in out: the unary stream of ubytes (known from
 * wd_gap_quotients), then the remainder stream of ceil(n * k / 8) bytes, then 8 bytes
 * of slack for its writers.  Returns 0, or -1 (out partly written) if the codes do not
 * end in the unary stream's last byte: positions that are not increasing, or a wrong
 * ubytes, never write past it.  In one pass: for k <= 8 eight remainders fill exactly k
 * bytes, packed in a register and stored apart, with no chain from one group to the
 * next (measured 135 against 180 us for 122K codes with a second pass for them). */
int wd_rice_positions(const int64_t *pos, int64_t n, int k, uint8_t *out, int64_t ubytes) {
    memset(out, 0, (size_t)ubytes);
    uint8_t *rem = out + ubytes;
    uint64_t bit = 0, end = 8 * (uint64_t)ubytes, fmask = k ? (1ULL << k) - 1 : 0;
    int64_t i = 0, prev = -1;
    if (k <= 8)
        for (; i + 8 <= n; i += 8, rem += k) {
            uint64_t group = 0;
            for (int j = 0; j < 8; j++) {
                uint64_t g = (uint64_t)(pos[i + j] - prev - 1);
                prev = pos[i + j];
                group |= (g & fmask) << (j * k);
                bit += g >> k;
                if (bit >= end) return -1;
                out[bit >> 3] |= (uint8_t)(1u << (bit & 7));
                bit++;
            }
            if (k) memcpy(rem, &group, 8);
        }
    field_writer f = {rem, 0, 0};
    for (; i < n; prev = pos[i++]) {
        uint64_t g = (uint64_t)(pos[i] - prev - 1);
        bit += g >> k;
        if (bit >= end) return -1;
        out[bit >> 3] |= (uint8_t)(1u << (bit & 7));
        bit++;
        if (k) field_put(&f, g & fmask, k);
    }
    field_end(&f);
    return bit > end - 8 ? 0 : -1;
}

/* One split level: the n words of rest that are not split, in order, into kept, and the
 * mask of them (bit i set where rest[i] != split, LSB first) into mask, which has room
 * for ceil(n / 64) 8-byte words (the padding is zeroed); returns how many are kept, and
 * the length of the mask up to the byte of its last 1 bit into *ubytes: the level's
 * unary stream for k = 0 (for any other k its set bits are coded as positions).
 * Branch-free, as levels keep about half; words i on (a multiple of 8), c of them kept
 * before. */
#define SPLIT_MASK(S, T)                                                                \
    static int64_t split_mask##S(const T *rest, int64_t n, T split, T *kept,            \
                                 uint8_t *mask, int64_t i, int64_t c) {                 \
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

#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
/* With SSSE3 (x86-64 CPUs since about 2008; checked at load) a level of 1- or 2-byte
 * words, the fp8 and bf16 steps, compares 16 bytes at a time and moves the kept words
 * to the front with one byte shuffle from a table: measured 22 against 96 us for 122K
 * bf16 words, whose per-word store, compare and count cost about 2 cycles in C. */
#include <tmmintrin.h>
#define SPLIT_SSSE3 1
static int have_ssse3;
static uint8_t keep_count[256];        /* how many bits of m are set */
static uint8_t keep_bytes[256][8];     /* indices of the set bits of m in order, then 0 */
static uint8_t keep_words[256][16];    /* the same for 2-byte words: bytes 2j and 2j + 1 */

__attribute__((constructor)) static void split_tables(void) {
    __builtin_cpu_init();
    have_ssse3 = __builtin_cpu_supports("ssse3");
    for (int m = 0; m < 256; m++) {
        int c = 0;
        for (int j = 0; j < 8; j++) {
            if (!(m >> j & 1)) continue;
            keep_bytes[m][c] = (uint8_t)j;
            keep_words[m][2 * c] = (uint8_t)(2 * j);
            keep_words[m][2 * c + 1] = (uint8_t)(2 * j + 1);
            c++;
        }
        keep_count[m] = (uint8_t)c;
    }
}

/* The stores write 8 or 16 bytes at the kept count, never past the words read so far:
 * no slack needed.  Returns the count; *done is where the scalar loop goes on. */
__attribute__((target("ssse3"))) static int64_t split_mask_ssse3_1(
    const uint8_t *rest, int64_t n, uint8_t split, uint8_t *kept, uint8_t *mask,
    int64_t *done) {
    __m128i s = _mm_set1_epi8((char)split);
    int64_t c = 0, i = 0;
    for (; i + 16 <= n; i += 16) {
        __m128i v = _mm_loadu_si128((const __m128i *)(rest + i));
        unsigned m = ~(unsigned)_mm_movemask_epi8(_mm_cmpeq_epi8(v, s)), lo = m & 255,
                 hi = m >> 8 & 255;
        mask[i >> 3] = (uint8_t)lo;
        mask[(i >> 3) + 1] = (uint8_t)hi;
        __m128i order = _mm_loadl_epi64((const __m128i *)keep_bytes[lo]);
        _mm_storel_epi64((__m128i *)(kept + c), _mm_shuffle_epi8(v, order));
        c += keep_count[lo];
        order = _mm_loadl_epi64((const __m128i *)keep_bytes[hi]);
        _mm_storel_epi64((__m128i *)(kept + c), _mm_shuffle_epi8(_mm_srli_si128(v, 8), order));
        c += keep_count[hi];
    }
    *done = i;
    return c;
}

__attribute__((target("ssse3"))) static int64_t split_mask_ssse3_2(
    const uint16_t *rest, int64_t n, uint16_t split, uint16_t *kept, uint8_t *mask,
    int64_t *done) {
    __m128i s = _mm_set1_epi16((short)split);
    int64_t c = 0, i = 0;
    for (; i + 8 <= n; i += 8) {
        __m128i v = _mm_loadu_si128((const __m128i *)(rest + i));
        __m128i eq = _mm_cmpeq_epi16(v, s);
        unsigned m = ~(unsigned)_mm_movemask_epi8(_mm_packs_epi16(eq, eq)) & 255;
        mask[i >> 3] = (uint8_t)m;
        __m128i order = _mm_loadu_si128((const __m128i *)keep_words[m]);
        _mm_storeu_si128((__m128i *)(kept + c), _mm_shuffle_epi8(v, order));
        c += keep_count[m];
    }
    *done = i;
    return c;
}
#endif

int64_t wd_split_mask(const void *rest, int64_t n, int size, uint64_t split, void *kept,
                      uint8_t *mask, int64_t *ubytes) {
    int64_t i = 0, c = 0;
#ifdef SPLIT_SSSE3
    if (have_ssse3 && size == 1)
        c = split_mask_ssse3_1(rest, n, (uint8_t)split, kept, mask, &i);
    if (have_ssse3 && size == 2)
        c = split_mask_ssse3_2(rest, n, (uint16_t)split, kept, mask, &i);
#endif
#define CASE(S, T) \
    if (size == S) c = split_mask##S((const T *)rest, n, (T)split, (T *)kept, mask, i, c);
    FOR_SIZES(CASE)
#undef CASE
    int64_t b = (n + 7) / 8;
    while (b && !mask[b - 1]) b--;
    *ubytes = b;
    return c;
}

/* The indices of the set bits of a mask of words 8-byte words, in increasing order,
 * into pos (room for cap); returns how many, or -1 if more than cap. */
static int64_t mask_positions(const uint8_t *mask, int64_t words, int64_t *pos, int64_t cap) {
    int64_t c = 0;
    for (int64_t w = 0; w < words; w++)
        for (uint64_t bits = load64(mask + 8 * w); bits; bits &= bits - 1) {
            if (c == cap) return -1;
            pos[c++] = 64 * w + __builtin_ctzll(bits);
        }
    return c;
}

/* A Rice-coded split level, parameter k (0..31): the indices of the count (>= 1) set
 * bits of a mask of words 8-byte words (from wd_split_mask) into pos (room for count),
 * and the Rice streams of their gaps into out (room for cap bytes) as
 * wd_rice_positions writes them.  Returns the unary stream's length, or -1 if the mask
 * does not hold count set bits or the streams would not fit. */
int64_t wd_rice_mask(const uint8_t *mask, int64_t words, int64_t count, int k, int64_t *pos,
                     uint8_t *out, int64_t cap) {
    if (count < 1 || mask_positions(mask, words, pos, count) != count) return -1;
    int64_t sums[6];
    wd_gap_quotients(pos, count, 1, k, 1, sums);
    int64_t ubytes = (sums[0] + count - 1) / 8 + 1;
    if (ubytes + (count * k + 7) / 8 + 8 > cap) return -1;
    return wd_rice_positions(pos, count, k, out, ubytes) ? -1 : ubytes;
}

/* The exact histogram of values[0], values[step], ... (n values, step >= 1) of 1- or
 * 2-byte words: the distinct words in increasing order into words and their counts into
 * counts (room for min(taken, 256^size)); returns how many distinct.  bins (4 tables of
 * 256^size) and present (a bit per word) are the caller's scratch, all zero, and left
 * so.  Neighbouring values count into the four tables in turn: most are one or two
 * words, and one table would chain each increment to the last. */
#define HISTOGRAM(S, T)                                                                 \
    static int64_t histogram##S(const T *values, int64_t n, int64_t step, uint32_t *bins, \
                                uint64_t *present, uint64_t *words, int64_t *counts) {  \
        const int64_t span = (int64_t)1 << (8 * S);                                     \
        int64_t r = 0;                                                                  \
        for (int64_t i = 0; i < n; i += step, r = (r + 1) & 3) {                        \
            T v = values[i];                                                            \
            if (!bins[r * span + v]++) present[v >> 6] |= 1ULL << (v & 63);             \
        }                                                                               \
        int64_t d = 0;                                                                  \
        for (int64_t w = 0; w < span / 64; w++) {                                       \
            for (uint64_t bits = present[w]; bits; bits &= bits - 1) {                  \
                int64_t v = 64 * w + __builtin_ctzll(bits);                             \
                words[d] = (uint64_t)v;                                                 \
                counts[d++] = (int64_t)bins[v] + bins[span + v] + bins[2 * span + v] +  \
                              bins[3 * span + v];                                       \
                for (int t = 0; t < 4; t++) bins[t * span + v] = 0;                     \
            }                                                                           \
            present[w] = 0;                                                             \
        }                                                                               \
        return d;                                                                       \
    }
HISTOGRAM(1, uint8_t)
HISTOGRAM(2, uint16_t)

int64_t wd_histogram(const void *values, int64_t n, int64_t step, int size, uint32_t *bins,
                     uint64_t *present, uint64_t *words, int64_t *counts) {
    if (size == 1)
        return histogram1((const uint8_t *)values, n, step, bins, present, words, counts);
    return histogram2((const uint16_t *)values, n, step, bins, present, words, counts);
}
