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

/* The lane bits of nonzero_lanes gathered into the low 8 / size bits (bit j: lane j).
 * The multipliers move each lane's top bit to its own bit of the high byte or nibble;
 * no two partial products share a bit, so nothing carries into the result. */
static inline uint64_t lane_bits(uint64_t lanes, int size) {
    switch (size) {
    case 1: return ((lanes >> 7) * 0x0102040810204080ULL) >> 56;
    case 2: return (((lanes >> 15) * 0x0001000200040008ULL) >> 48) & 0xF;
    case 4: return ((lanes >> 31) & 1) | (lanes >> 62);
    default: return lanes >> 63;
    }
}

/* Outputs of the change pass have room for cap + CHANGES_SLACK entries: the vector
 * path stores whole registers (up to 64 lanes) past the last entry it keeps. */
#define CHANGES_SLACK 64

/* The portable pass over elements from..m of a chunk: appends to the n entries found
 * so far the positions where the size-byte elements of base and target differ, in
 * increasing order, and at each the words of both transforms, t ^ b and zigzag(t - b);
 * returns the new count, or -1 as soon as more than cap differ (outputs then partial).
 * 64 bytes are compared at a time and skipped when equal; in a block that differs, the
 * differing lanes become one bit mask whose set bits are visited in order, so the only
 * unpredictable branch is that loop's exit. */
#define CHANGES(S, T, HIGH)                                                             \
    static int64_t changes##S(const T *b, const T *t, int64_t from, int64_t m, int64_t cap, \
                              int64_t *pos, T *xr, T *sb, int64_t n) {                  \
        int64_t i = from;                                                               \
        const int per = 8 / S, block = 64 / S;                                          \
        for (; i + block <= m; i += block) {                                            \
            uint64_t x[8], any = 0, mask = 0;                                           \
            for (int w = 0; w < 8; w++) {                                               \
                x[w] = load64((const uint8_t *)(b + i) + 8 * w) ^                       \
                       load64((const uint8_t *)(t + i) + 8 * w);                        \
                any |= x[w];                                                            \
            }                                                                           \
            if (!any) continue;                                                         \
            for (int w = 0; w < 8; w++)                                                 \
                mask |= lane_bits(nonzero_lanes(x[w], HIGH), S) << (w * per);           \
            if (n + __builtin_popcountll(mask) > cap) return -1;                        \
            while (mask) {                                                              \
                int64_t e = i + __builtin_ctzll(mask);                                  \
                T d = (T)(t[e] - b[e]);                                                 \
                pos[n] = e;                                                             \
                xr[n] = (T)(t[e] ^ b[e]);                                               \
                sb[n] = (T)((T)(d << 1) ^ (T)(0 - (d >> (8 * S - 1))));                 \
                n++;                                                                    \
                mask &= mask - 1;                                                       \
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

/* The AVX-512 pass needs GCC 8 or clang (their AVX-512 VBMI2 intrinsics and
 * __builtin_cpu_supports names); the build hook compiles with WD_PORTABLE_ONLY defined
 * where a compiler refuses it, and the library then has the portable passes only. */
#if defined(__x86_64__) && (defined(__clang__) || (defined(__GNUC__) && __GNUC__ >= 8)) && \
    !defined(WD_PORTABLE_ONLY)
#define WD_AVX512 1
#endif

#ifdef WD_AVX512
#include <immintrin.h>
/* The AVX-512 pass (F, BW and VBMI2: Ice Lake, Zen 4 and later), chosen at run time:
 * a register of lanes is compared at once, and the differing lanes' positions and words
 * are compressed into the outputs without a branch per element.  It covers the whole
 * registers of the chunk and leaves the tail to the portable pass. */
#define AVX512 __attribute__((target("avx512f,avx512bw,avx512vbmi2,popcnt")))

/* Positions i + j for the set bits j of the 8-lane mask k, stored at out. */
AVX512 static inline void put_positions(int64_t *out, int64_t i, __mmask8 k) {
    __m512i at = _mm512_add_epi64(_mm512_set1_epi64(i), _mm512_set_epi64(7, 6, 5, 4, 3, 2, 1, 0));
    _mm512_storeu_si512(out, _mm512_maskz_compress_epi64(k, at));
}

/* Positions i + j of the c lanes j whose indices (bytes, or 16-bit words) a compress left
 * at the start of v, widened 8 at a time.  The first 8 are stored whatever c is (a
 * branch there would be mispredicted about as often as a register holds no change);
 * more than 8 in one register is rare below the bitmap density. */
AVX512 static inline void put_indices8(int64_t *out, int64_t i, __m512i v, int c) {
    __m512i at = _mm512_set1_epi64(i);
    _mm512_storeu_si512(out, _mm512_add_epi64(at, _mm512_cvtepu8_epi64(_mm512_castsi512_si128(v))));
    if (c <= 8) return;
    uint8_t idx[64];
    _mm512_storeu_si512(idx, v);
    for (int j = 8; j < c; j += 8) {
        __m128i eight = _mm_loadl_epi64((const __m128i *)(idx + j));
        _mm512_storeu_si512(out + j, _mm512_add_epi64(at, _mm512_cvtepu8_epi64(eight)));
    }
}
AVX512 static inline void put_indices16(int64_t *out, int64_t i, __m512i v, int c) {
    __m512i at = _mm512_set1_epi64(i);
    _mm512_storeu_si512(out, _mm512_add_epi64(at, _mm512_cvtepu16_epi64(_mm512_castsi512_si128(v))));
    if (c <= 8) return;
    uint16_t idx[32];
    _mm512_storeu_si512(idx, v);
    for (int j = 8; j < c; j += 8) {
        __m128i eight = _mm_loadu_si128((const __m128i *)(idx + j));
        _mm512_storeu_si512(out + j, _mm512_add_epi64(at, _mm512_cvtepu16_epi64(eight)));
    }
}

/* Each size's positions of the lanes set in k: compressed lane indices for the narrow
 * lanes (one compress for the register, not one per 8 lanes), compressed positions for
 * the wide ones. */
AVX512 static inline void positions1(int64_t *out, int64_t i, __mmask64 k, int c) {
    const __m512i iota = _mm512_set_epi8(
        63, 62, 61, 60, 59, 58, 57, 56, 55, 54, 53, 52, 51, 50, 49, 48, 47, 46, 45, 44, 43, 42,
        41, 40, 39, 38, 37, 36, 35, 34, 33, 32, 31, 30, 29, 28, 27, 26, 25, 24, 23, 22, 21, 20,
        19, 18, 17, 16, 15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
    put_indices8(out, i, _mm512_maskz_compress_epi8(k, iota), c);
}
AVX512 static inline void positions2(int64_t *out, int64_t i, __mmask32 k, int c) {
    const __m512i iota = _mm512_set_epi16(
        31, 30, 29, 28, 27, 26, 25, 24, 23, 22, 21, 20, 19, 18, 17, 16, 15, 14, 13, 12, 11, 10,
        9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
    put_indices16(out, i, _mm512_maskz_compress_epi16(k, iota), c);
}
AVX512 static inline void positions4(int64_t *out, int64_t i, __mmask16 k, int c) {
    (void)c;
    put_positions(out, i, (__mmask8)k);
    put_positions(out + __builtin_popcount(k & 0xFF), i + 8, (__mmask8)(k >> 8));
}
AVX512 static inline void positions8(int64_t *out, int64_t i, __mmask8 k, int c) {
    (void)c;
    put_positions(out, i, k);
}

/* zigzag(d) = (d << 1) ^ (d >> (bits - 1)), the shift arithmetic; there is no 8-bit
 * shift, so for bytes the sign lanes come from a mask. */
AVX512 static inline __m512i zigzag8(__m512i d) {
    return _mm512_xor_si512(_mm512_add_epi8(d, d), _mm512_movm_epi8(_mm512_movepi8_mask(d)));
}
AVX512 static inline __m512i zigzag16(__m512i d) {
    return _mm512_xor_si512(_mm512_slli_epi16(d, 1), _mm512_srai_epi16(d, 15));
}
AVX512 static inline __m512i zigzag32(__m512i d) {
    return _mm512_xor_si512(_mm512_slli_epi32(d, 1), _mm512_srai_epi32(d, 31));
}
AVX512 static inline __m512i zigzag64(__m512i d) {
    return _mm512_xor_si512(_mm512_slli_epi64(d, 1), _mm512_srai_epi64(d, 63));
}

/* The differing lanes of one register pair, compressed to the outputs at n; returns the
 * new n.  Branch-free: a register without changes stores nothing that is kept. */
#define PUT_AVX512(S, T, BITS, MASK, POPCNT)                                            \
    AVX512 static inline int64_t put##S##_avx512(__m512i vb, __m512i vt, MASK k, int64_t i, \
                                                 int64_t n, int64_t *pos, T *xr, T *sb) { \
        __m512i z = zigzag##BITS(_mm512_sub_epi##BITS(vt, vb));                         \
        __m512i x = _mm512_xor_si512(vb, vt);                                           \
        _mm512_storeu_si512(xr + n, _mm512_maskz_compress_epi##BITS(k, x));             \
        _mm512_storeu_si512(sb + n, _mm512_maskz_compress_epi##BITS(k, z));             \
        int c = POPCNT(k);                                                              \
        positions##S(pos + n, i, k, c);                                                 \
        return n + c;                                                                   \
    }

/* Registers are taken GROUP at a time and a group without changes is skipped: sparse
 * changes cost one well-predicted branch per group, while at a few percent, where most
 * registers hold a change, nearly every group takes the branch-free path (a branch per
 * register mispredicted about every other one: 1.27 ms against 0.80 ms for a
 * 4M-element bf16 chunk at 3%).  The loop stops before the tail, at *at. */
#define GROUP 4
#define CHANGES_AVX512(S, T, BITS, MASK, POPCNT)                                        \
    PUT_AVX512(S, T, BITS, MASK, POPCNT)                                                \
    AVX512 static int64_t changes##S##_avx512(const T *b, const T *t, int64_t m,        \
                                              int64_t cap, int64_t *pos, T *xr, T *sb,   \
                                              int64_t *at) {                            \
        const int lanes = 64 / S;                                                       \
        int64_t n = 0, i = 0;                                                           \
        for (; i + GROUP * lanes <= m; i += GROUP * lanes) {                            \
            __m512i vb[GROUP], vt[GROUP];                                               \
            MASK k[GROUP], any = 0;                                                     \
            int c = 0;                                                                  \
            for (int r = 0; r < GROUP; r++) {                                           \
                vb[r] = _mm512_loadu_si512(b + i + r * lanes);                          \
                vt[r] = _mm512_loadu_si512(t + i + r * lanes);                          \
                k[r] = _mm512_cmpneq_epi##BITS##_mask(vb[r], vt[r]);                    \
                any |= k[r];                                                            \
                c += POPCNT(k[r]);                                                      \
            }                                                                           \
            if (!any) continue;                                                         \
            if (n + c > cap) return -1;                                                 \
            for (int r = 0; r < GROUP; r++)                                             \
                n = put##S##_avx512(vb[r], vt[r], k[r], i + r * lanes, n, pos, xr, sb); \
        }                                                                               \
        *at = i;                                                                        \
        return n;                                                                       \
    }
CHANGES_AVX512(1, uint8_t, 8, __mmask64, __builtin_popcountll)
CHANGES_AVX512(2, uint16_t, 16, __mmask32, __builtin_popcount)
CHANGES_AVX512(4, uint32_t, 32, __mmask16, __builtin_popcount)
CHANGES_AVX512(8, uint64_t, 64, __mmask8, __builtin_popcount)

static int has_avx512(void) {
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vbmi2");
}
#else
static int has_avx512(void) { return 0; }
#endif

/* Which change pass wd_find_changes takes when simd is asked for: 1 the AVX-512 one,
 * 0 the portable one (no such CPU, or built without it: not x86-64, WD_PORTABLE_ONLY). */
int wd_simd(void) { return has_avx512(); }

/* The change pass over a chunk of m size-byte elements (see CHANGES): the AVX-512 one
 * where simd is set and the CPU has it, else the portable one; the same results.  The
 * outputs have room for cap + CHANGES_SLACK entries. */
int64_t wd_find_changes(const void *base, const void *target, int64_t m, int64_t cap, int size,
                        int64_t *pos, void *xr, void *sb, int simd) {
    int64_t from = 0, n = 0;
#ifdef WD_AVX512
#define VECTOR(S, T)                                                                    \
    if (size == S)                                                                      \
        n = changes##S##_avx512((const T *)base, (const T *)target, m, cap, pos, (T *)xr, \
                                (T *)sb, &from);
    if (simd && has_avx512()) {
        FOR_SIZES(VECTOR)
        if (n < 0) return n;
    }
#undef VECTOR
#else
    (void)simd;
#endif
#define CASE(S, T)                                                                      \
    if (size == S)                                                                      \
        return changes##S((const T *)base, (const T *)target, from, m, cap, pos, (T *)xr, \
                          (T *)sb, n);
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

/* The decoder's Rice streams (§7.6.3).  The payload's structure (lengths, counts, the
 * last unary byte, the quotients' bound, padding bits) is validated in Python; these two
 * only turn bits of buffers of known length into numbers. */

/* The stream indices (LSB first) of the set bits of the n bytes, in increasing order:
 * the first cap of them into out (out may be NULL with cap 0); returns how many there
 * are, so a caller can count first and then fill exactly. */
int64_t wd_set_bits(const uint8_t *bytes, int64_t n, int64_t *out, int64_t cap) {
    int64_t c = 0, i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t w = load64(bytes + i);
        if (c + __builtin_popcountll(w) > cap) {
            c += __builtin_popcountll(w);
            continue;
        }
        while (w) {
            out[c++] = 8 * i + __builtin_ctzll(w);
            w &= w - 1;
        }
    }
    for (; i < n; i++)
        for (int b = 0; b < 8; b++)
            if (bytes[i] >> b & 1) {
                if (c < cap) out[c] = 8 * i + b;
                c++;
            }
    return c;
}

/* Positions from Rice codes: p_i = ((ones[i] - i) << k) + (r_0 + ... + r_i) + i, where
 * ones are the unary stream's 1-bit indices and r the count k-bit fields (k 0..31) of
 * the remainder stream rem, LSB first, of exactly ceil(count * k / 8) bytes.  The
 * caller checked that length and that the quotients stay within the chunk, which keeps
 * every sum below 2^58 (chunks hold at most 2^26 elements).  Each field is read with
 * one 8-byte load at its bit offset while 8 bytes remain; the last ones byte by byte. */
void wd_rice_decode(const int64_t *ones, int64_t count, const uint8_t *rem, int k,
                       int64_t *out) {
    uint64_t sum = 0, mask = k ? (1ULL << k) - 1 : 0;
    int64_t nbytes = (count * k + 7) / 8, i = 0;
    for (; i < count && (i * k >> 3) + 8 <= nbytes; i++) {
        uint64_t bit = (uint64_t)(i * k);
        sum += (load64(rem + (bit >> 3)) >> (bit & 7)) & mask;
        out[i] = (int64_t)(((uint64_t)(ones[i] - i) << k) + sum + (uint64_t)i);
    }
    for (; i < count; i++) {
        uint64_t bit = (uint64_t)(i * k), field = 0;
        for (int j = 0; j < k; j++, bit++) field |= (uint64_t)(rem[bit >> 3] >> (bit & 7) & 1) << j;
        sum += field;
        out[i] = (int64_t)(((uint64_t)(ones[i] - i) << k) + sum + (uint64_t)i);
    }
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
